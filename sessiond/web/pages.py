"""The console's pages, rendered on the server (Jinja2, escaped by default).

``/`` the live process table, ``/s/NAME`` a session, ``/s/NAME/artifact/REF`` an
artifact (a diff rendered), ``/inbox`` the approvals inbox, and
``/approvals/NAME/CALL`` the confirm page of one approval: the inbox links to
it, and a signed one-shot link from a notice can open it the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jinja2
from aiohttp import web
from markupsafe import Markup, escape

from sessiond import __version__
from sessiond.errors import InvalidInput, SessiondError
from sessiond.web.humane import actions_for, time_tag, wake_tag
from sessiond.web.site import Site
from sessiond.web.views import (
    ARTIFACT_TYPES,
    MESSAGES_PAGE,
    STATES,
    approvals,
    artifact_refs,
    artifact_text,
    diff_lines,
    find_approval,
    messages_before,
)

if TYPE_CHECKING:
    from sessiond.sdkwire import Message


class Pages:
    def __init__(self, server: Site) -> None:
        self.server = server
        self.kernel = server.kernel
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("sessiond.web", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["when"] = time_tag
        self.env.filters["wake"] = wake_tag
        self.env.globals["actions_for"] = actions_for

    def routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/login", self.login)
        router.add_post("/logout", self.logout)
        router.add_get("/", self.table)
        router.add_get("/inbox", self.inbox)
        router.add_get("/approvals/{name}/{call}", self.confirm)
        router.add_get("/s/{name}", self.session)
        router.add_get("/s/{name}/artifact/{ref}", self.artifact)
        router.add_static("/static", _static_dir(), append_version=False)

    def render(self, request: web.Request | None, template: str, status: int = 200,
               **context: Any) -> web.Response:  # fmt: skip
        context.setdefault("pending", None)
        html = self.env.get_template(template).render(
            csrf=self.server.csrf(request) if request is not None else "",
            user=self.server.user_of(request),
            version=__version__,
            unconfined=self.kernel.config.run.sandbox == "off",  # said on every page
            **context,
        )
        return web.Response(text=html, status=status, content_type="text/html")

    async def show(self, request: web.Request, template: str, **context: Any) -> web.Response:
        """A logged-in page: :meth:`render` with the approvals tab's pending count."""
        return self.render(request, template, pending=await self.pending(request), **context)

    async def pending(self, request: web.Request) -> int | None:
        """How many approvals wait (the whole cluster's on a cluster node); None when
        the other nodes do not answer (the tab then shows no number rather than a wrong one)."""
        if self.server.cluster.clustered:
            try:
                return len(await self.server.cluster.approvals(self.server.who(request)))
            except (SessiondError, OSError, TimeoutError):  # a node down: the page renders
                return None
        count = 0
        await self.kernel.table.ensure_all()  # the approvals waiting are in the logs
        for s in list(self.kernel.table):
            if s.journal_or_none is not None and s.journal.state.approvals:
                count += len(s.journal.state.pending_approvals())
        return count

    def error_page(
        self, message: str, status: int, request: web.Request | None = None
    ) -> web.Response:
        """The page of a refusal (``request``: who is signed in, for the header)."""
        heading, todo = ERRORS.get(status, ERRORS[400 if status < 500 else 500])
        return self.render(request, "error.html", status=status, message=ticks(message),
                           heading=heading, todo=ticks(todo), code=status,
                           title=heading.lower())  # fmt: skip

    async def login(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token", "")
        found = self.kernel.logins.user_for(token) if token else None
        if found is None:
            return self.error_page(
                "this login link is not valid (each `sessionctl web` replaces the user's "
                "earlier login): run `sessionctl web` again and open the URL it prints", 401
            )  # fmt: skip
        response = web.HTTPSeeOther("/")  # the token leaves the address bar
        self.server.auth.cookie(response, token)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        response = web.HTTPSeeOther("/login")
        response.del_cookie("sessiond_login", path="/")
        return response

    async def table(self, request: web.Request) -> web.Response:
        q = request.query
        if q.get("state") and q["state"] not in STATES:  # a bad address: said, not a dead stream
            raise InvalidInput(f"no state {q['state']!r}; the states are {', '.join(STATES)}")
        shown = {k: q.get(k, "") for k in ("state", "agent", "label")}
        shown["page"] = q.get("page", "1") if q.get("page", "1").isdigit() else "1"
        return await self.show(request, "table.html", states=STATES, title="sessions", q=shown,
                           total=len(self.kernel.table),
                           clustered=self.server.cluster.clustered)  # fmt: skip

    async def inbox(self, request: web.Request) -> web.Response:
        cluster = self.server.cluster
        items = (
            await cluster.approvals(self.server.who(request))
            if cluster.clustered
            else await approvals(self.kernel.table)
        )
        # the tab's count is the list's length: the nodes are not asked twice
        return self.render(request, "inbox.html", items=items, pending=len(items),
                           title="approvals")  # fmt: skip

    async def confirm(self, request: web.Request) -> web.Response:
        if "link" in request.query:  # a signed link from a notice (no login)
            return await self.server.links.page(request)
        name, call = request.match_info["name"], request.match_info["call"]
        if self.server.cluster.remote(name):
            pending = await self.server.cluster.pending(name, self.server.who(request))
            item = next((i for i in pending if i["call"] == call), None)
        else:
            item = await find_approval(self.kernel.table, name, call)
        return await self.show(request, "confirm.html", item=item, name=name, call=call,
                           title=f"approve {call}?")  # fmt: skip

    async def session(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        cluster, who = self.server.cluster, self.server.who(request)
        # another node's session: the same syscalls, carried to it (sessiond.web.cluster)
        detail = await cluster.show(name, who)
        gate = await cluster.gate(name, who)
        before = before_of(request)
        messages, older = await self.messages(name, before)
        # the newest events that name artifacts, not the whole log (it may be long)
        named = await cluster.log(name, who, 1, ARTIFACT_TYPES, 200) if detail["seq"] else []
        refs = artifact_refs(named)
        pending = await cluster.pending(name, who)
        return await self.show(
            request, "session.html", d=detail, gate=gate, messages=messages, older=older,
            before=before, artifacts=refs[:100], approvals=pending, title=name,
        )  # fmt: skip

    async def messages(self, name: str, before: int | None) -> tuple[list[Message], int | None]:
        """A page of the session's messages view, newest first (``before``: older pages)."""
        if self.server.cluster.remote(name):  # folded from the events table here
            upto_here, folded = await self.server.cluster.folded(name, before)
            return await messages_before(upto_here, folded, before, MESSAGES_PAGE)
        s = self.kernel.table.get(name)
        if s.journal_or_none is None:
            return [], None
        state = s.journal.state
        upto = state.seq if before is None else min(state.seq, before)
        records = self.kernel.store.read(name, upto=upto) if upto else iter(())
        return await messages_before(records, state, before, MESSAGES_PAGE)

    async def artifact(self, request: web.Request) -> web.Response:
        name, ref = request.match_info["name"], request.match_info["ref"]
        # NoSuchSession for a session that is not there (on any node)
        named = await self.server.cluster.log(name, self.server.who(request), 1, ARTIFACT_TYPES)
        refs = {a["ref"]: a for a in artifact_refs(named)}
        if ref not in refs:
            raise InvalidInput(f"session {name!r} names no artifact {ref!r}")
        text, cut = artifact_text(self.kernel.store.artifacts(name), ref)
        meta = refs[ref]
        lines = diff_lines(text) if meta["diff"] else None
        return await self.show(request, "artifact.html", name=name, a=meta, text=text, cut=cut,
                           lines=lines, title=meta["name"])  # fmt: skip


# Each error page's heading, and what a person can do about it.
ERRORS: dict[int, tuple[str, str]] = {
    400: ("That request is not right",
          "Nothing was changed. The message above says what was wrong; fix the address or "
          "the form and try again."),
    401: ("Sign in first",
          "Each run of `sessionctl web` prints a fresh login URL and replaces your earlier "
          "login, so an old URL, or a browser signed in before it, lands here. Run it again "
          "on the daemon's machine and open the URL it prints."),
    403: ("Refused",
          "Nothing was changed. Open the console through the URL `sessionctl web` prints, "
          "as a person, not from a session's program."),
    404: ("Not found",
          "The name may be mistyped, or the session was removed. The sessions list shows "
          "every session there is."),
    409: ("Not possible now",
          "Nothing was changed: the session (or the link) is not in a state where this can "
          "happen. Open the session's page to see what it offers now."),
    410: ("This link has expired",
          "Nothing was changed. If the approval still waits, answer it in the console's "
          "approvals tab (run `sessionctl web` for a login), or with `sessionctl approve`."),
    500: ("Something broke",
          "This is a bug in sessiond; the daemon log has the details. The daemon goes on."),
}  # fmt: skip


def ticks(text: str) -> Markup:
    """Escaped text with its `quoted commands` as <code> (messages are written for a terminal)."""
    parts = str(escape(text)).split("`")
    if len(parts) % 2 == 0:  # an odd backtick: leave the text as it is
        return Markup(escape(text))
    return Markup("".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts)))


def before_of(request: web.Request) -> int | None:
    """``?before=SEQ``: an older page of the messages view."""
    text = request.query.get("before", "")
    if not text:
        return None
    # ASCII digits only: str.isdigit() also takes "²" (int() refuses it), Arabic-Indic digits
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise InvalidInput(f"before must be a seq, a whole number (got {text[:40]!r})")
    return int(text)


def _static_dir() -> str:
    from pathlib import Path

    return str(Path(__file__).parent / "static")
