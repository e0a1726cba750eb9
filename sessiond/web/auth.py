"""Who is asking, on the web listener: the login cookie, CSRF, the run check.

- **Login.** ``/login?token=T`` (the URL ``sessionctl web`` prints) checks T
  against the stored digests (sessiond.syscalls.logins) and sets it as an
  HttpOnly, SameSite=Strict cookie; every later request carries it. A script
  may send ``Authorization: Bearer T`` instead (no cookie: nothing a browser
  sends by itself, so nothing to forge).
- **CSRF.** A request that acts (any method but GET/HEAD) with the cookie must
  carry the page's CSRF token in ``X-CSRF-Token`` (or a ``csrf`` form field):
  an HMAC of the login under a key made at start-up, so another site can
  neither read nor guess it. Its ``Origin``, when sent, must be the console's.
- **No CORS.** Nothing here answers with Access-Control-Allow-*: another
  origin's scripts cannot read an answer, with or without credentials.
- **Runs.** A process of a run is refused here as on the control socket, and
  so is a peer that cannot be identified (sessiond.web.peers). A request that
  acts is judged afresh, and its connection must still be open when its answer
  is recorded (:func:`connected`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from sessiond.ipc.program import NotGranted
from sessiond.syscalls.logins import Logins
from sessiond.web.peers import GONE, WebPeers
from sessiond.webconfig import WebConfig, is_loopback

COOKIE = "sessiond_login"
SAFE = frozenset({"GET", "HEAD"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Login:
    user: str
    uid: int | None  # of the operator who minted it with `sessionctl web`
    token: str = field(repr=False)  # a secret: never in a log line or a traceback
    by_cookie: bool = False


class Auth:
    def __init__(self, logins: Logins, peers: WebPeers, config: WebConfig) -> None:
        self.logins = logins
        self.peers = peers
        self.config = config
        self._key = secrets.token_bytes(32)  # CSRF tokens live as long as the daemon

    def csrf(self, token: str) -> str:
        raw = token.encode(errors="surrogateescape")
        return hmac.new(self._key, hashlib.sha256(raw).digest(), "sha256").hexdigest()

    def login_of(self, request: web.Request) -> Login | None:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            token = header.removeprefix("Bearer ").strip()
            found = self.logins.user_for(token)
            return Login(found.user, found.uid, token, by_cookie=False) if found else None
        token = request.cookies.get(COOKIE, "")
        found = self.logins.user_for(token) if token else None
        return Login(found.user, found.uid, token, by_cookie=True) if found else None

    def cookie(self, response: web.StreamResponse, token: str) -> None:
        response.set_cookie(
            COOKIE,
            token,
            httponly=True,
            samesite="Strict",
            secure=self.config.url().startswith("https://"),
            path="/",
        )

    def csrf_refusal(self, request: web.Request, login: Login) -> str | None:
        """Why an acting request may not act (None: it may)."""
        if request.method in SAFE or not login.by_cookie:
            return None
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self.origins(request):
            return f"requests from {origin} may not act here"
        sent = request.headers.get("X-CSRF-Token", "")
        if not sent or not hmac.compare_digest(sent, self.csrf(login.token)):
            return "missing or wrong CSRF token: reload the page and try again"
        return None

    def origins(self, request: web.Request) -> set[str]:
        own = {f"{request.scheme}://{request.host}"}
        if self.config.public_url:
            url = urllib.parse.urlsplit(self.config.public_url)
            own.add(f"{url.scheme}://{url.netloc}")
        return own

    def host_refusal(self, request: web.Request) -> str | None:
        """On a console only this machine reaches, a request must name this machine:
        a page of another site whose name was pointed at 127.0.0.1 (DNS rebinding)
        names its own host, and gets nothing, not even /metrics."""
        if not self.config.local_only:
            return None
        host = urllib.parse.urlsplit(f"//{request.host}").hostname or ""
        if is_loopback(host):
            return None
        return f"this console answers to loopback names only, not {request.host!r}"

    async def run_refusal(self, request: web.Request) -> str | None:
        """Why this request's peer may not use the console (a run's process, or one
        that cannot be identified), or None. A request that acts has its peer
        examined afresh (who holds the connection now); its answer is recorded
        only while the connection is still open (:func:`connected`)."""
        acts = request.method not in SAFE
        transport = request.transport
        if transport is None or transport.is_closing():
            return GONE
        peer, us = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        if not isinstance(peer, tuple) or not isinstance(us, tuple):
            return None  # not TCP (a test's Unix socket): there is no peer to map
        return await asyncio.to_thread(
            functools.partial(self.peers.refusal, peer[:2], us[:2], fresh=acts)
        )


def connected(request: web.Request) -> None:
    """Raise unless the request's connection is still open: checked just before an
    answer is recorded, so a request whose peer has gone changes nothing."""
    transport = request.transport
    if transport is None or transport.is_closing():
        raise NotGranted(f"refused: {GONE}; nothing was done")
