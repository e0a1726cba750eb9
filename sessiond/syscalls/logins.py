"""Web console logins (docs/design.md section 11): one per user, stored hashed.

``sessionctl web`` (an operator action) mints a login for the calling user: a
random token, given to that person once (in the URL it prints) and kept here
only as its SHA-256 (with the uid that minted it), so a copy of the state dir
lets nobody in. Minting again
replaces the user's login: the old token stops working at once. Every web
action names the user its login belongs to, with the channel ``web``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import orjson

from sessiond.errors import Refused
from sessiond.log.store.durable import private_dir, write_durable
from sessiond.replies import WebLogin, Who
from sessiond.webconfig import WebConfig

TOKEN_BYTES = 32


def digest(token: str) -> str:
    # surrogateescape: a header of non-UTF-8 bytes (aiohttp keeps them as surrogates)
    # is a wrong token like any other, not an exception
    return hashlib.sha256(token.encode(errors="surrogateescape")).hexdigest()


@dataclass(frozen=True)
class WebUser:
    """Whose login a token is: the user and uid that minted it (``sessionctl web``)."""

    user: str
    uid: int | None


class _Login(TypedDict):
    """One user's entry in the logins file: its token's digest, the uid that minted it."""

    sha256: str
    uid: int | None


class Logins:
    """The logins file (``STATE_DIR/web/logins.json``: user -> digest and uid)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "web" / "logins.json"
        self.port: int | None = None  # the port the web console bound, once it has
        self._logins: dict[str, _Login] | None = None

    def _load(self) -> dict[str, _Login]:
        if self._logins is None:
            try:
                loaded = orjson.loads(self.path.read_bytes())
            except FileNotFoundError:
                loaded = {}
            self._logins = {
                str(u): {"sha256": str(entry.get("sha256", "")), "uid": entry.get("uid")}
                for u, entry in dict(loaded).items()
            }
        return self._logins

    def mint(self, user: str, uid: int | None = None) -> str:
        """A new token for ``user``, replacing the one it had."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        logins: dict[str, _Login] = {**self._load(), user: {"sha256": digest(token), "uid": uid}}
        private_dir(self.path.parent)
        write_durable(self.path, orjson.dumps(logins, option=orjson.OPT_SORT_KEYS))
        self._logins = logins
        return token

    def user_for(self, token: str) -> WebUser | None:
        """Whose login ``token`` is, or None (compared in constant time)."""
        wanted = digest(token)
        found = None
        for user, entry in self._load().items():
            if hmac.compare_digest(str(entry.get("sha256", "")), wanted):
                found = WebUser(user, entry.get("uid"))
        return found

    def bound(self, port: int) -> None:
        """The console listens on ``port`` now: the URL of a login names it."""
        self.port = port

    def login(self, web: WebConfig, port: int | None, who: Who) -> WebLogin:
        """``sessionctl web``: a fresh login for the caller and the URL that uses it."""
        if web.listen is None:
            raise Refused(
                'the web console is off: set [web] listen (e.g. "127.0.0.1:8765") in the '
                "daemon's configuration and restart it (docs/web.md)"
            )
        user = str(who.get("user") or who.get("uid"))
        token = self.mint(user, who.get("uid"))
        base = web.url(port)
        return {"user": user, "url": f"{base}/login?token={token}", "console": base}
