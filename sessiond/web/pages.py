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

from sessiond import __version__
from sessiond.errors import InvalidInput
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
    from sessiond.web.server import WebServer


class Pages:
    def __init__(self, server: WebServer) -> None:
        self.server = server
        self.kernel = server.kernel
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("sessiond.web", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )

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
        html = self.env.get_template(template).render(
            csrf=self.server.csrf(request) if request is not None else "",
            user=self.server.user_of(request),
            version=__version__,
            unconfined=self.kernel.config.run.sandbox == "off",  # said on every page
            **context,
        )
        return web.Response(text=html, status=status, content_type="text/html")

    def error_page(self, message: str, status: int) -> web.Response:
        return self.render(None, "error.html", status=status, message=message, title="error")

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
        return self.render(request, "table.html", states=STATES, title="sessions",
                           total=len(self.kernel.table),
                           clustered=self.server.cluster.clustered)  # fmt: skip

    async def inbox(self, request: web.Request) -> web.Response:
        cluster = self.server.cluster
        items = (
            await cluster.approvals(self.server.who(request))
            if cluster.clustered
            else await approvals(self.kernel.table)
        )
        return self.render(request, "inbox.html", items=items, title="approvals")

    async def confirm(self, request: web.Request) -> web.Response:
        if "link" in request.query:  # a signed link from a notice (no login)
            return await self.server.links.page(request)
        name, call = request.match_info["name"], request.match_info["call"]
        if self.server.cluster.remote(name):
            pending = await self.server.cluster.pending(name, self.server.who(request))
            item = next((i for i in pending if i["call"] == call), None)
        else:
            item = await find_approval(self.kernel.table, name, call)
        return self.render(request, "confirm.html", item=item, name=name, call=call,
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
        return self.render(
            request, "session.html", d=detail, gate=gate, messages=messages, older=older,
            before=before, artifacts=refs[:100], approvals=pending, title=name,
        )  # fmt: skip

    async def messages(
        self, name: str, before: int | None
    ) -> tuple[list[dict[str, Any]], int | None]:
        """A page of the session's messages view, newest first (``before``: older pages)."""
        if self.server.cluster.remote(name):  # folded from the events table here
            upto_here, folded = await self.server.cluster.folded(name, before)
            return await messages_before(upto_here, folded, before, MESSAGES_PAGE)
        s = self.kernel.table.get(name)
        if s.journal is None:
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
        return self.render(request, "artifact.html", name=name, a=meta, text=text, cut=cut,
                           lines=lines, title=meta["name"])  # fmt: skip


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
