"""Web console logins (DESIGN.md section 11): one per user, stored hashed.

``sessionctl web`` (an operator action) mints a login for the calling user: a
random token, given to that person once (in the URL it prints) and kept here
only as its SHA-256, so a copy of the state dir lets nobody in. Minting again
replaces the user's login: the old token stops working at once. Every web
action names the user its login belongs to, with the channel ``web``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any

import orjson

from sessiond.errors import Refused
from sessiond.log.store.durable import private_dir, write_durable
from sessiond.webconfig import WebConfig

TOKEN_BYTES = 32


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Logins:
    """The logins file (``STATE_DIR/web/logins.json``: user -> token digest)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "web" / "logins.json"
        self._digests: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        if self._digests is None:
            try:
                loaded = orjson.loads(self.path.read_bytes())
            except FileNotFoundError:
                loaded = {}
            self._digests = {str(u): str(d) for u, d in dict(loaded).items()}
        return self._digests

    def mint(self, user: str) -> str:
        """A new token for ``user``, replacing the one it had."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        digests = {**self._load(), user: digest(token)}
        private_dir(self.path.parent)
        write_durable(self.path, orjson.dumps(digests, option=orjson.OPT_SORT_KEYS))
        self._digests = digests
        return token

    def user_for(self, token: str) -> str | None:
        """The user whose login ``token`` is, or None (compared in constant time)."""
        wanted = digest(token)
        found = None
        for user, stored in self._load().items():
            if hmac.compare_digest(stored, wanted):
                found = user
        return found

    def login(self, web: WebConfig, port: int | None, who: dict[str, Any]) -> dict[str, Any]:
        """``sessionctl web``: a fresh login for the caller and the URL that uses it."""
        if web.listen is None:
            raise Refused(
                'the web console is off: set [web] listen (e.g. "127.0.0.1:8765") in the '
                "daemon's configuration and reload or restart it (docs/web.md)"
            )
        user = str(who.get("user") or who.get("uid"))
        token = self.mint(user)
        base = web.url(port)
        return {"user": user, "url": f"{base}/login?token={token}", "console": base}
