"""The signed one-shot links of approval notices, on the web console.

``GET /approvals/NAME/CALL?link=TOKEN`` shows the approval and one button; it
never acts, so a link preview, a mail scanner or a prefetch cannot answer. The
person's ``POST`` to the same address answers, through the same syscall as
``sessionctl approve``/``deny``, recorded with the channel ``link`` and the user
``notify:<target>``: the link is a bearer credential sent to that target, so
"whoever reads that target" is all the daemon knows of who used it.

Each link is used at most once, durably: its use is written and fsynced to
``STATE_DIR/web/links-used`` before the answer is recorded, so a second use is
refused even after a restart (and a crash between the two burns the link
without an answer: at most once, never twice). A link is refused, with the
reason, when it was changed (its signature), is used on another approval's
address, has expired, was used, its approval was answered another way, or what
the call would run changed since the link was sent.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from aiohttp import web

from sessiond.errors import SessiondError
from sessiond.log.records import ApprovalRecord
from sessiond.log.store.durable import private_dir, write_all, write_durable
from sessiond.notify.links import BadLink, Link, LinkKey, call_digest
from sessiond.replies import Who
from sessiond.web.auth import connected
from sessiond.web.site import Site
from sessiond.web.views import find_approval

KEEP_EXPIRED = 86400  # used links are forgotten a day after they expire


class LinkRefused(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class UsedLinks:
    """The links already used (``STATE_DIR/web/links-used``: a line per use)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "web" / "links-used"
        self._used: dict[str, int] | None = None
        self._lock = threading.Lock()

    def _load(self) -> dict[str, int]:
        if self._used is None:
            used: dict[str, int] = {}
            try:
                raw = self.path.read_bytes()
            except FileNotFoundError:
                raw = b""
            cutoff = int(time.time()) - KEEP_EXPIRED
            lines = [line for line in raw.split(b"\n") if line]
            for line in lines:
                use_id, _, expires = line.decode(errors="replace").partition(" ")
                if use_id and expires.isdigit() and int(expires) > cutoff:
                    used[use_id] = int(expires)
            if len(used) < len(lines):  # long expired ones (refused as expired anyway) go
                kept = "".join(f"{u} {e}\n" for u, e in used.items())
                write_durable(self.path, kept.encode())
            self._used = used
        return self._used

    def used(self, link: Link) -> bool:
        return link.use_id in self._load()

    async def claim(self, link: Link) -> bool:
        """Mark ``link`` used, durably; False if it was already (a race: two POSTs)."""
        used = self._load()
        if link.use_id in used:
            return False
        used[link.use_id] = link.expires  # before the await: a second POST sees it
        try:
            await asyncio.to_thread(self._write, f"{link.use_id} {link.expires}\n".encode())
        except OSError:
            del used[link.use_id]
            raise
        return True

    def _write(self, line: bytes) -> None:
        with self._lock:
            private_dir(self.path.parent)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.path, flags, 0o600)
            try:
                write_all(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)


class LinkPages:
    def __init__(self, server: Site) -> None:
        self.server = server
        self.kernel = server.kernel
        self.key = LinkKey(server.kernel.config.state_dir)
        self.used = UsedLinks(server.kernel.config.state_dir)

    def check(self, request: web.Request) -> Link:
        """The request's link, if it may answer now; LinkRefused with the reason."""
        try:
            link = self.key.verify(request.query.get("link", ""))
        except BadLink as exc:
            raise LinkRefused(f"this link is not valid: {exc}. {_ELSEWHERE}", 403) from None
        name, call = request.match_info["name"], request.match_info["call"]
        if (link.session, link.call) != (name, call):
            raise LinkRefused(
                f"this link is for call {link.call} of session {link.session}, not call "
                f"{call} of {name}. {_ELSEWHERE}",
                403,
            )
        if self.used.used(link):
            raise LinkRefused(
                f"this link was already used: each approval's links answer it once. {_ELSEWHERE}",
                409,
            )
        self.live(link)
        s = self.kernel.table.get(name)
        pending = s.journal.state.pending_approvals() if s.journal_or_none is not None else {}
        if call not in pending:
            raise LinkRefused(
                f"session {name} has no pending approval {call}: it was answered, or it is "
                "gone (`sessionctl show` says which)",
                409,
            )
        if call_digest(s, call) != link.digest:
            raise LinkRefused(
                f"what call {call} of {name} would run changed since this link was sent (its "
                "arguments or the session's command): answer it from the console's inbox, "
                "where you see what it runs now",
                409,
            )
        return link

    def live(self, link: Link) -> None:
        """LinkRefused once ``link`` has expired."""
        if self.kernel.store.clock() // 1_000_000_000 >= link.expires:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(link.expires))
            raise LinkRefused(f"this link expired at {when}. {_ELSEWHERE}", 410)

    async def page(self, request: web.Request) -> web.Response:
        """GET: the confirm page. It shows the approval and one button; it acts on nothing."""
        try:
            link = self.check(request)
        except LinkRefused as exc:
            return self.server.pages.error_page(str(exc), exc.status)
        item = await find_approval(self.kernel.table, link.session, link.call)
        return self.server.pages.render(
            None,
            "link.html",
            item=item,
            link=link,
            action=request.path_qs,
            expires=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(link.expires)),
            title=f"{link.answer} {link.call}?",
        )

    async def answer(self, request: web.Request) -> web.Response:
        """POST: answer the approval, once."""
        try:
            link = self.check(request)
            origin = request.headers.get("Origin")
            # a form's POST from the confirm page says "null" (no-referrer) or ours
            if origin not in (None, "null") and origin not in self.server.auth.origins(request):
                raise LinkRefused(f"requests from {origin} may not answer here", 403)
            # the whole form before the use is claimed: a body that never comes (a
            # phone losing its signal) or is refused (too big) must not burn the link
            note = await self._note(request)
            self._connected(request)  # a peer gone burns nothing and answers nothing
            if not await self._claim(link):
                raise LinkRefused("this link was already used. " + _ELSEWHERE, 409)
        except LinkRefused as exc:
            return self.server.pages.error_page(str(exc), exc.status)
        who: Who = {"uid": None, "user": f"notify:{link.target}", "channel": "link"}
        s = self.kernel.table.get(link.session)

        def unchanged(_approval: ApprovalRecord) -> None:
            # checked again under the session's lock: nothing changed since check(),
            # and the link is still live (a body sent slowly, a wait for the lock)
            self.live(link)
            if call_digest(s, link.call) != link.digest:
                raise LinkRefused("what the call would run changed just now", 409)
            self._connected(request)

        try:
            if link.answer == "approve":
                result = await self.kernel.approve(
                    link.session, link.call, note, who=who, check=unchanged
                )
            else:
                result = await self.kernel.deny(
                    link.session, link.call, "", note, who=who, check=unchanged
                )
        except (SessiondError, LinkRefused) as exc:
            status = exc.status if isinstance(exc, LinkRefused) else 409
            return self.server.pages.error_page(
                f"the link was used but not answered: {exc}. {_ELSEWHERE}", status
            )
        return self.server.pages.render(
            None,
            "link_done.html",
            link=link,
            done="approved" if link.answer == "approve" else "denied",
            state=result.get("state", ""),
            title=f"{link.call} {link.answer}d",
        )

    @staticmethod
    def _connected(request: web.Request) -> None:
        """LinkRefused once the request's connection is gone (sessiond.web.auth)."""
        try:
            connected(request)
        except SessiondError as exc:
            raise LinkRefused(str(exc), 403) from None

    async def _claim(self, link: Link) -> bool:
        try:
            return await self.used.claim(link)
        except OSError as exc:  # links-used cannot be written: nothing is answered
            raise LinkRefused(
                f"the link's use cannot be recorded ({exc.strerror or exc}), so nothing was "
                f"answered; the link works once that is fixed. {_ELSEWHERE}",
                503,
            ) from None

    @staticmethod
    async def _note(request: web.Request) -> str:
        try:
            form = await request.post()
        except ValueError as exc:  # a malformed body (a bad multipart boundary)
            raise LinkRefused(
                f"the form cannot be read ({exc}); nothing was answered", 400
            ) from None
        return str(form.get("note", ""))[:2000]


_ELSEWHERE = (
    "Answer it from the web console's inbox (`sessionctl web` prints a login) or with "
    "`sessionctl approve`/`deny`"
)
