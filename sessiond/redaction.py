"""Redaction: masking a session's secrets out of everything it stores.

A session's ``Redactor`` is built from its spec's ``redact`` patterns (regular
expressions) and from literal values known only while it runs (its resolved
``[run] secrets`` and its run token). It masks text, bytes (artifacts) and JSON
values (event fields such as a tool call's arguments): every match becomes
``[REDACTED]``. ``matches`` says where a value holds a match, for what must be
refused rather than masked (a step's result or a model response: a masked one
could not be replayed).

On the ground floor: the log, the table, the runs and the SDK all use it. Built
once per set of patterns and values (``redactor`` caches them), so the append
path pays nothing for a session with no pattern: it gets ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

MASK = "[REDACTED]"


class Redactor:
    """Compiled patterns plus literal values; every match is replaced by ``MASK``."""

    __slots__ = ("_any", "_literals", "_patterns")

    def __init__(self, patterns: Sequence[str] = (), literals: Sequence[str] = ()) -> None:
        # One regex per pattern, applied in order (as written): patterns joined into
        # one alternation would break on inline flags or repeated group names.
        self._patterns = [re.compile(p) for p in patterns]
        values = sorted({v for v in literals if v}, key=len, reverse=True)  # longest first
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

    def data(self, value: bytes) -> bytes:
        """Bytes masked as text: undecodable bytes pass through unchanged."""
        if not value:
            return value
        text = value.decode(errors="surrogateescape")
        masked = self.text(text)
        return value if masked is text else masked.encode(errors="surrogateescape")

    def walk(self, value: Any) -> Any:
        """A JSON value with every string in it masked (dict values and list items;
        keys are left: they name fields). Returns ``value`` itself when nothing
        changed, so a caller can tell with ``is``."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out: dict[Any, Any] | None = None  # a copy only once something changed
            for key, inner in value.items():
                masked = self.walk(inner)
                if masked is not inner:
                    out = dict(value) if out is None else out
                    out[key] = masked
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
