"""The web listener: one aiohttp application, started inside the daemon's loop.

Why aiohttp (docs/web.md): its ``AppRunner``/``TCPSite`` serve on the loop
that is already running (uvloop's, the daemon's) and own nothing else: no
signal handlers, no loop of their own, no lifespan to juggle, so the daemon
module starts and stops it like the control socket. One package gives the
server, streaming answers (the process table's server-sent events) and the
client the tests use. Pages are rendered on the server (Jinja2, escaped by
default) with one small script; page and API share the listener.

Every request passes, in order: the run check (a run's process is refused,
sessiond.web.auth), the login (cookie or bearer), CSRF on acting requests. The
answers carry a strict Content-Security-Policy and never a CORS header.
"""

from __future__ import annotations

import asyncio
import ssl

import structlog
from aiohttp import web

from sessiond.errors import SessiondError
from sessiond.replies import Who
from sessiond.sandboxconfig import run_uids
from sessiond.syscalls.kernel import Kernel
from sessiond.web.api import Api
from sessiond.web.auth import Auth, Handler, Login, connected
from sessiond.web.cluster import Carrier, ClusterView, Hinted
from sessiond.web.links import LinkPages
from sessiond.web.metrics import Metrics
from sessiond.web.pages import Pages
from sessiond.web.peers import WebPeers
from sessiond.webconfig import WebConfig, split_listen

log = structlog.get_logger(__name__)

LOGIN = web.RequestKey("login", Login)
OPEN_PATHS = frozenset({"/login", "/static/app.js", "/static/style.css"})
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",  # the login URL's token never leaves in a Referer
    "Cache-Control": "no-store",
}
STATUS = {"no_such_session": 404, "invalid_input": 400, "permission_denied": 403}


def error_json(code: str, message: str, status: int) -> web.Response:
    return web.json_response({"ok": False, "error": {"code": code, "message": message}},
                             status=status)  # fmt: skip


def status_of(exc: SessiondError) -> int:
    if exc.code in STATUS:
        return STATUS[exc.code]
    return 400 if exc.exit_code == 5 else 409


def wants_html(request: web.Request) -> bool:
    return not request.path.startswith(("/api/", "/metrics"))


class WebServer:
    """Serves the console on ``[web] listen`` until closed."""

    def __init__(
        self,
        config: WebConfig,
        kernel: Kernel,
        metrics: Metrics,
        forward: Carrier | None = None,
        hints: Hinted | None = None,
    ) -> None:
        self.config = config
        self.kernel = kernel
        self.metrics = metrics
        observe = kernel.observe
        metrics.notify_failed = lambda: sum(
            t.failed_total for t in (observe.notices.targets if observe.notices else [])
        )
        metrics.sandbox = lambda: kernel.config.run.sandbox == "on"  # the current config
        metrics.models = lambda: (
            kernel.model_source.models_view() if kernel.model_source is not None else None
        )
        peers = WebPeers(run_uids(kernel.config))  # a run's uid is never an operator's
        self.auth = Auth(kernel.logins, peers, config)
        self.closing = asyncio.Event()  # ends the event streams at shutdown
        # the whole cluster's sessions on a cluster node (its forward and hints given)
        self.cluster = ClusterView(kernel, forward, hints)
        self.pages = Pages(self)
        self.api = Api(self)
        self.links = LinkPages(self)
        self.app = web.Application(middlewares=[self._guard], client_max_size=1 << 20)
        self.app.on_response_prepare.append(self._headers)
        self.pages.routes(self.app.router)
        self.api.routes(self.app.router)
        self.app.router.add_post("/approvals/{name}/{call}", self.links.answer)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    @staticmethod
    async def _headers(request: web.Request, response: web.StreamResponse) -> None:
        """Before any answer's headers go out (a stream's too): the security headers."""
        response.headers.update(HEADERS)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        why = await self.auth.run_refusal(request)
        if why is not None:
            log.info("web.refused", path=request.path, method=request.method, why=why)
            return self._refuse(
                request, "permission_denied",
                f"refused: {why}. The web console is for people; a session's program "
                "talks to the daemon through its program endpoint", 403,
            )  # fmt: skip
        why = self.auth.host_refusal(request)
        if why is not None:
            return self._refuse(request, "permission_denied", why, 403)
        if request.path in OPEN_PATHS or (request.path == "/metrics" and self.config.local_only):
            return await handler(request)
        if "link" in request.query and request.path.startswith("/approvals/"):
            # a signed one-shot link from a notice: the link is the credential
            # (sessiond.web.links checks it), no login or CSRF token
            return await self._answer(request, handler)
        login = self.auth.login_of(request)
        if login is None:
            return self._refuse(
                request, "unauthenticated",
                "not logged in: run `sessionctl web` on the daemon's machine and open "
                "the URL it prints", 401,
            )  # fmt: skip
        why = self.auth.csrf_refusal(request, login)
        if why is not None:
            return self._refuse(request, "csrf", why, 403)
        request[LOGIN] = login
        return await self._answer(request, handler)

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            # a session not opened yet (after a start-up): opened now, for a request
            # that passed its checks (nothing is done for one refused)
            if (name := request.match_info.get("name")) is not None:
                await self.kernel.table.ensure(name)
            return await handler(request)
        except SessiondError as exc:
            return self._refuse(request, exc.code, str(exc), status_of(exc))
        except (web.HTTPException, ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug: said and logged; the daemon goes on
            log.exception("web.request_failed", path=request.path)
            return self._refuse(
                request, "internal",
                f"internal error: {type(exc).__name__}: {exc}; this is a bug in sessiond, "
                "the daemon log has the details", 500,
            )  # fmt: skip

    def _refuse(self, request: web.Request, code: str, message: str, status: int) -> web.Response:
        if wants_html(request) and request.method in ("GET", "HEAD"):
            return self.pages.error_page(message, status, request)
        return error_json(code, message, status)

    def who(self, request: web.Request) -> Who:
        """Who acts, as the syscalls record it: the login's user on the web channel.
        Only while the request's connection is open (a peer gone acts on nothing)."""
        connected(request)
        login = request[LOGIN]
        return {"uid": login.uid, "user": login.user, "channel": "web"}

    def user_of(self, request: web.Request | None) -> str:
        login = request.get(LOGIN) if request is not None else None
        return login.user if login is not None else ""

    def csrf(self, request: web.Request | None) -> str:
        login = request.get(LOGIN) if request is not None else None
        return self.auth.csrf(login.token) if login is not None else ""

    async def start(self) -> str:
        """Listen; the console's URL."""
        assert self.config.listen is not None
        host, port = split_listen(self.config.listen)
        context = None
        if self.config.tls_cert is not None and self.config.tls_key is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     shutdown_timeout=2.0)  # fmt: skip
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=context)
        await site.start()
        server = site._server  # the bound port, for port 0
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port
        self.kernel.logins.bound(self.port)
        url = self.config.url(self.port)
        log.info("web.listening", url=url, listen=self.config.listen)
        return url

    async def close(self) -> None:
        self.closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
