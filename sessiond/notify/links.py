"""Signed one-shot approve and deny links in approval notices (docs/design.md section 11).

A link names one answer to one approval: the session, the call, a digest of
what the call would do (its tool and arguments), when the link expires and the
notify target it was sent to. It is signed with HMAC-SHA256 under a key of the
daemon's own (``STATE_DIR/web/links.key``, 32 random bytes, owner-only, made
once), so nobody can make one or change one without that file. The stdlib's
``hmac`` does all that is needed here: a library such as itsdangerous would add
a dependency for the same few lines, and its timestamps are not the expiry we
want (the approval's, from the log).

A link is deterministic: the same record gives the same link, so a notice sent
again after a crash carries the same links. It opens the confirm page of the
web console; only a POST from there answers (sessiond.web.links), at most once.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import orjson

from sessiond.log.store.durable import fsync_dir, private_dir
from sessiond.table.sessions import Session

KEY_BYTES = 32
VERSION = 1
Answer = Literal["approve", "deny"]


class BadLink(Exception):
    """A link that is not one this daemon made (tampered, cut, or another key's)."""


@dataclass(frozen=True, slots=True)
class Link:
    session: str
    call: str
    digest: str  # of the call's tool and arguments when the link was made
    expires: int  # Unix seconds
    answer: Answer
    target: str  # the [[notify]] target it was sent to (who answers: "notify:<target>")

    @property
    def use_id(self) -> str:
        """What a use burns: one approval's links (approve and deny) answer it once."""
        raw = orjson.dumps([self.session, self.call, self.digest, self.expires])
        return hashlib.sha256(raw).hexdigest()

    def path(self) -> str:
        return f"/approvals/{quote(self.session, safe='')}/{quote(self.call, safe='')}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class LinkKey:
    """The daemon's link key: made once, kept owner-only in the state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "web" / "links.key"
        self._key: bytes | None = None

    def key(self) -> bytes:
        if self._key is None:
            self._key = self._load()
        return self._key

    def _load(self) -> bytes:
        private_dir(self.path.parent)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:  # the first start: a new key, durable before any link is signed with it
            try:
                os.write(fd, secrets.token_bytes(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(self.path.parent)
        info = self.path.lstat()
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{self.path} is not a regular file; move it away")
        if stat.S_IMODE(info.st_mode) & 0o077:  # anyone who reads it can forge answers
            os.chmod(self.path, 0o600)
        key = self.path.read_bytes()
        if len(key) < KEY_BYTES:
            raise OSError(f"{self.path} is cut short ({len(key)} bytes); delete it for a new one")
        return key

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self.key(), b"sessiond-link\0" + payload.encode(), "sha256")
        return _b64(mac.digest())

    def token(self, link: Link) -> str:
        body = [VERSION, link.session, link.call, link.digest, link.expires, link.answer]
        payload = _b64(orjson.dumps([*body, link.target]))
        return f"{payload}.{self._sign(payload)}"

    def url(self, base: str, link: Link) -> str:
        return f"{base.rstrip('/')}{link.path()}?link={self.token(link)}"

    def verify(self, token: str) -> Link:
        """The link ``token`` stands for; BadLink if this daemon did not sign it as is."""
        payload, dot, sig = token.partition(".")
        if not dot or len(token) > 4096:
            raise BadLink("not a link of this daemon")
        if not hmac.compare_digest(sig.encode(errors="replace"), self._sign(payload).encode()):
            raise BadLink("its signature does not match: it was changed or cut")
        try:
            version, session, call, digest, expires, answer, target = orjson.loads(_unb64(payload))
        except (ValueError, TypeError) as exc:
            raise BadLink(f"it cannot be read ({exc})") from None
        if version != VERSION or answer not in ("approve", "deny"):
            raise BadLink("it is of another version of sessiond")
        return Link(str(session), str(call), str(digest), int(expires), answer, str(target))


CHANGED = "changed"  # a command call whose spec's command is another now


def call_digest(s: Session, call: str) -> str | None:
    """What the approval of ``call`` would let run, as a digest of its tool, its
    recorded arguments and the request (when it was asked); ``CHANGED`` for a
    command session's call once the spec's command is no longer the one it asked
    for (a spec applied since: approving it would run nothing it showed). None: no
    such call."""
    if s.journal_or_none is None:
        return None
    recorded = s.journal.state.calls.get(call)
    if recorded is None:
        return None
    args: Any = recorded.get("args", {})
    run = s.spec.run if s.spec is not None else None
    if recorded["tool"] == "command" and run is not None:
        asked = args.get("exec") if isinstance(args, dict) else None
        if asked != list(run.exec):
            return CHANGED
    # and which request it answers (its record's time): a session made anew under
    # the name asks its first call again, with the same id and arguments
    approval = s.journal.state.approvals.get(call)
    asked_at = approval.get("requested_at") if approval is not None else None
    raw = orjson.dumps([recorded["tool"], args, asked_at], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(raw).hexdigest()[:32]


def expiry(requested_ts: str, ttl: float) -> int:
    """Unix seconds: ``ttl`` after the request's record (RFC 3339, from the log)."""
    when = dt.datetime.fromisoformat(requested_ts[:26].rstrip("Z") + "+00:00")
    return int(when.timestamp() + ttl)


def approval_links(
    key: LinkKey,
    base: str,
    s: Session,
    # a record of any event type, read by key
    record: Mapping[str, Any],
    *,
    target: str,
    ttl: float | None,
) -> tuple[tuple[str, str], ...]:
    """The approve and deny links of an ``approval.requested`` record, or none when
    its call is no longer known (the notice is sent late; the console has it)."""
    call = (record.get("data") or {}).get("call")
    digest = call_digest(s, call) if isinstance(call, str) else None
    if digest is None or digest == CHANGED or call is None:
        return ()
    if ttl is None:
        ttl = s.spec.policy.approval_ttl if s.spec is not None else 3600.0
    expires = expiry(record["ts"], ttl)
    return tuple(
        (answer, key.url(base, Link(s.name, call, digest, expires, answer, target)))
        for answer in ("approve", "deny")
    )
