"""Redaction: masking a session's secrets out of everything it stores.

A session's ``Redactor`` is built from its spec's ``redact`` patterns (regular
expressions) and from literal values known only while it runs (its resolved
``[run] secrets`` and its run token). It masks text, bytes (artifacts) and JSON
values (event fields such as a tool call's arguments): every match becomes
``[REDACTED]``. ``matches`` says where a value holds a match, for what must be
refused rather than masked (a step's result or a model response: a masked one
could not be replayed).

What names a thing rather than says something (a step's key or name, a key of a
step's arguments) is masked with ``ident`` instead: each match becomes
``redacted.<12 hex>``, an HMAC-SHA256 of the matched text under the daemon's
mask key (``STATE_DIR/redact.key``, 32 random bytes, owner-only, made once).
Two different secrets stay two different names and the same secret is always
the same name, so a masked step key still tells steps apart and finds its step
again in a later run; the digest is keyed, so nobody without the file can test
a guess (a card number, a short password) against it, and only 48 bits of it
are kept.

On the ground floor: the log, the table, the runs and the SDK all use it. Built
once per set of patterns and values (``redactor`` caches them), so the append
path pays nothing for a session with no pattern: it gets ``None``.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

MASK = "[REDACTED]"
# What a name's match becomes: in the alphabet of a step's key (letters, digits,
# "._:/-"), so a masked key is still a key that can be named (``resolve``).
IDENT = re.compile(r"redacted\.[0-9a-f]{12}")
KEY_BYTES = 32

# The daemon's mask key (``use_key_file``); until it is set (a library user, a unit
# test), a key of this process only: masks are then stable for its lifetime.
_mask_key: list[bytes] = [secrets.token_bytes(KEY_BYTES)]


def use_key_file(path: Path) -> None:
    """Make ``path`` the mask key (created once, 0600): masked names stay the same
    across restarts, so a step whose key held a secret is found again."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:  # the first start: durable before anything is masked with it
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path} is not a regular file; move it away")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o600)
    key = path.read_bytes()
    if len(key) < KEY_BYTES:
        raise OSError(
            f"{path} is cut short ({len(key)} bytes); restore it from a backup (steps whose "
            "key held a secret are found by it), or delete it for a new one"
        )
    _mask_key[0] = key


def ident_of(secret: str) -> str:
    """The mask of one matched text: the same text, the same mask."""
    mac = hmac.new(
        _mask_key[0], b"sessiond-mask\0" + secret.encode(errors="surrogateescape"), "sha256"
    )
    return f"redacted.{mac.hexdigest()[:12]}"


def _escaped(value: str) -> set[str]:
    """A secret's value as it is written raw, in a JSON string (either way of
    escaping) and in a Python ``repr`` (an SDK error is ``repr(exc)``): a value
    holding a quote, a backslash or a control character reaches the daemon so."""
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    for quoted in (repr(value), repr(value + "'"), repr(value + '"')):
        forms.add(quoted[1:-1].removesuffix("\\'").removesuffix("'").removesuffix('"'))
    return {f for f in forms if f}


class Redactor:
    """Compiled patterns plus literal values; every match is replaced by ``MASK``."""

    __slots__ = ("_any", "_literals", "_patterns")

    def __init__(self, patterns: Sequence[str] = (), literals: Sequence[str] = ()) -> None:
        # One regex per pattern, applied in order (as written): patterns joined into
        # one alternation would break on inline flags or repeated group names.
        self._patterns = [re.compile(p) for p in patterns]
        forms = {form for v in literals if v for form in _escaped(v)}
        values = sorted(forms, key=len, reverse=True)  # longest first
        literal = "|".join(map(re.escape, values))
        self._literals = re.compile(literal) if values else None
        # Most text holds no match: one search of everything at once says so, at
        # a fraction of the substitutions' cost. Where the patterns cannot be joined,
        # each is searched in turn.
        joined = [f"(?:{p})" for p in patterns] + ([literal] if values else [])
        try:
            self._any: re.Pattern[str] | None = re.compile("|".join(joined))
        except re.error:
            self._any = None

    def text(self, value: str) -> str:
        """``value`` with every pattern and literal masked (``value`` itself, the
        same object, when nothing matched)."""
        if not value or not self.search(value):
            return value
        out = value
        if self._literals is not None:
            masked, n = self._literals.subn(MASK, out)
            out = masked if n else out
        for pattern in self._patterns:
            masked, n = pattern.subn(MASK, out)
            out = masked if n else out
        return out

    def ident(self, value: str) -> str:
        """``value`` with each match replaced by its keyed digest (``ident_of``): for
        what names a thing (a step's key, a key of its arguments), which must stay
        distinct and stable once masked. ``value`` itself when nothing matched. The
        matches of every pattern are found in ``value`` as given and merged, so the
        result depends on ``value`` alone; masks already in it are left as they are."""
        if not value or not self.search(value):
            return value
        spans: list[tuple[int, int]] = []
        finders = ([self._literals] if self._literals is not None else []) + self._patterns
        for finder in finders:
            spans.extend(m.span() for m in finder.finditer(value) if m.end() > m.start())
        spans.extend(m.span() for m in IDENT.finditer(value))
        if not spans:
            return value
        spans.sort()
        merged: list[list[int]] = []
        for start, end in spans:
            if merged and start < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        out, at = [], 0
        for start, end in merged:
            part = value[start:end]
            out += [value[at:start], part if IDENT.fullmatch(part) else ident_of(part)]
            at = end
        out.append(value[at:])
        joined = "".join(out)
        return value if joined == value else joined

    def data(self, value: bytes) -> bytes:
        """Bytes masked as text: undecodable bytes pass through unchanged."""
        if not value:
            return value
        text = value.decode(errors="surrogateescape")
        masked = self.text(text)
        return value if masked is text else masked.encode(errors="surrogateescape")

    def walk(self, value: Any) -> Any:
        """A JSON value with every string in it masked: values and list items as
        text, keys of objects as names (``ident``: two keys stay two keys). Returns
        ``value`` itself when nothing changed, so a caller can tell with ``is``."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out: dict[Any, Any] | None = None  # a copy only once something changed
            for key, inner in value.items():
                masked = self.walk(inner)
                name = self.ident(key) if isinstance(key, str) else key
                if masked is not inner or name is not key:
                    if out is None:  # the keys before this one, as they were
                        out = {}
                        for k, v in value.items():
                            if k is key:
                                break
                            out[k] = v
                    out[name] = masked
                elif out is not None:
                    out[key] = inner
            return value if out is None else out
        if isinstance(value, list | tuple):
            items: list[Any] | None = None
            for i, inner in enumerate(value):
                masked = self.walk(inner)
                if masked is not inner:
                    items = list(value) if items is None else items
                    items[i] = masked
            return value if items is None else type(value)(items)
        return value

    def search(self, value: str) -> bool:
        """Whether ``value`` holds anything this redactor masks."""
        if self._any is not None:
            return self._any.search(value) is not None
        if self._literals is not None and self._literals.search(value):
            return True
        return any(p.search(value) for p in self._patterns)


@lru_cache(maxsize=512)
def _compiled(patterns: tuple[str, ...], literals: frozenset[str]) -> Redactor:
    return Redactor(patterns, tuple(literals))


def redactor(patterns: Sequence[str], literals: frozenset[str] = frozenset()) -> Redactor | None:
    """The redactor for these patterns and values, compiled once; None when there is
    nothing to mask (the common case, which then costs nothing)."""
    if not patterns and not literals:
        return None
    return _compiled(tuple(patterns), literals)


def matches(patterns: Sequence[str] | Redactor | None, value: object) -> str | None:
    """Where in ``value`` (a JSON-like value: dicts, lists, strings, bytes) the first
    string matching a pattern is, as a path (``$``, ``$.choices[0].text``, or
    ``$.headers (one of its keys)``: a path never holds the match itself); None
    when nothing matches.

    For what is refused rather than masked: a step's result or a model response
    that a mask would change could not be replayed as it was."""
    r = patterns if isinstance(patterns, Redactor) or patterns is None else redactor(patterns)
    if r is None:
        return None
    return _first(r, value, "$")


def _first(r: Redactor, value: object, path: str) -> str | None:
    if isinstance(value, str):
        return path if r.search(value) else None
    if isinstance(value, bytes | bytearray | memoryview):
        return path if r.search(bytes(value).decode(errors="surrogateescape")) else None
    if isinstance(value, dict):
        for key, inner in value.items():
            plain = isinstance(key, str) and key.isidentifier()
            where = f"{path}.{key}" if plain else f"{path}[{key!r}]"
            if isinstance(key, str) and r.search(key):
                return f"{path} (one of its keys)"  # never the key: it holds the match
            if (found := _first(r, inner, where)) is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            if (found := _first(r, inner, f"{path}[{i}]")) is not None:
                return found
    return None
