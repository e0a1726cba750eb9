"""What a ``log`` request asks for, and a follow that loses nothing.

On the ground floor because both ends need the same answer: sessionctl checks
``--since`` and ``--grep`` before it sends them (a bad one is a usage error, with
no round trip), the daemon filters with the very same rules (``invalid_input``
for a raw client), and sessionctl's ``log --follow`` resumes with ``follow``
below when the daemon says the reader fell behind.

``since`` is a seq when it is an integer (``42``; on the wire a JSON integer),
else a time: a duration back from now in the units specs use (``10m``, ``2h``,
``1h30m``, ``45s``) or an RFC 3339 timestamp with its offset
(``2026-12-01T09:00:00Z``). A number is never a time and a time always has a
unit or a date, so the two cannot be confused.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

import orjson

from sessiond.describe import describe
from sessiond.wire import Connection, RemoteError

# the reply types, for mypy only: sessionctl starts without building them
if TYPE_CHECKING:
    from sessiond.codec import EventRecord

MAX_GREP = 1024  # characters of a --grep pattern; a regex longer than that is an attack
FELL_BEHIND = "fell_behind"  # the error code (sessiond.errors.FellBehind)
# The units of sessiond.durations, read here without it: it brings pydantic, and
# sessionctl must start fast.
_DURATION = re.compile(r"(\d+(\.\d+)?(ms|s|m|h|d))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_MAX_BACK = 36500 * 86400.0  # a hundred years, as durations.MAX_DURATION
SINCE_FORMS = (
    "a seq (42), a duration back from now (10m, -2h, 1h30m), today, yesterday, now, "
    "or an RFC 3339 time with its offset (2026-12-01T09:00:00Z)"
)
DAYS = {"today": 0, "yesterday": 1}  # local midnight, this many days back


class LogRequest(TypedDict):
    """A ``log`` request's params, as sessionctl sends them (docs/rpc.md)."""

    name: str | None  # None: every session (--all, with -f)
    since: int | str
    types: list[str]
    limit: int
    grep: str | None
    follow: bool
    until: NotRequired[str]
    after: NotRequired[dict[str, int]]  # per session: only what comes after this seq


def _ts(when: datetime) -> str:
    """The form of an event's ``ts`` (codec.Timestamper), so that texts compare as times."""
    d = when.astimezone(UTC)
    return (
        f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:"
        f"{d.second:02d}.{d.microsecond:06d}Z"
    )


def parse_since(since: int | str, now_ns: int) -> tuple[int, str | None]:
    """(the first seq, the earliest ``ts`` or None) that ``since`` asks for; ValueError
    naming the value and the accepted forms if it is none of them."""
    if isinstance(since, bool) or not isinstance(since, int | str):
        raise ValueError(f"since {since!r} is not {SINCE_FORMS}")
    if isinstance(since, int):
        if since < 1:
            raise ValueError(f"since {since} is not a seq: seqs start at 1")
        return since, None
    text = since.strip()
    if text.isdigit():
        raise ValueError(f"since {since!r}: a seq is sent as a JSON integer, not text")
    moment = absolute(text, now_ns, what="since")
    if moment is not None:
        return 1, moment
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"since {since!r} is not {SINCE_FORMS}") from None
    if when.tzinfo is None:
        raise ValueError(
            f"since {since!r} has no UTC offset; add one (…Z or …+01:00): the daemon "
            "and this client may not share a time zone"
        )
    return 1, _ts(when)


def absolute(text: str, now_ns: int, what: str = "since") -> str | None:
    """The ``ts`` that a relative time means now: ``10m`` or ``-10m`` (back from now),
    ``now``, ``today`` or ``yesterday`` (midnight where this process runs; sessionctl
    sends the result, so it is the person's midnight, as in journalctl); None for
    any other text (an RFC 3339 time, or not a time at all)."""
    text = text.strip()
    now = datetime.fromtimestamp(now_ns / 1e9, UTC)
    if text == "now":
        return _ts(now)
    if text in DAYS:
        local = now.astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
        return _ts(local - timedelta(days=DAYS[text]))
    back = text.removeprefix("-")
    if _DURATION.fullmatch(back):
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(back))
        if seconds > _MAX_BACK:
            raise ValueError(f"{what} {text!r}: go back at most 100 years ('36500d')")
        return _ts(now - timedelta(seconds=seconds))
    return None


def parse_until(until: str | None, now_ns: int) -> str | None:
    """The latest ``ts`` that ``until`` asks for (None: no bound); ValueError naming
    the value and the accepted forms if it is none of them. A seq is not one: use -n."""
    if until is None:
        return None
    text = until.strip()
    if text.isdigit():
        raise ValueError(f"until {until!r} is a number; give a time: {UNTIL_FORMS}")
    moment = absolute(text, now_ns, what="until")
    if moment is not None:
        return moment
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"until {until!r} is not {UNTIL_FORMS}") from None
    if when.tzinfo is None:
        raise ValueError(f"until {until!r} has no UTC offset; add one (…Z or …+01:00)")
    return _ts(when)


UNTIL_FORMS = (
    "a duration back from now (10m, -2h), today, yesterday, now, or an RFC 3339 time "
    "with its offset (2026-12-01T09:00:00Z)"
)


def compile_grep(pattern: str | None) -> Grep | None:
    """The ``--grep`` regex, or ValueError naming the pattern and what is wrong with it.

    Matched with RE2, in time linear in the event's length. Python's ``re``
    backtracks, and one ``search`` cannot be interrupted (it holds the GIL, so
    not even a thread helps): ``.*.*.*.*!`` on one event of 3,000 characters held
    the daemon, and every session in it, for minutes, and ``.*!`` alone on a
    64 KiB event for seconds. No check of the pattern's shape bounds that; an
    engine that never backtracks does. Its price: no backreferences or
    lookaround, and ``\\w``, ``\\d`` are ASCII only."""
    if pattern is None:
        return None
    if len(pattern) > MAX_GREP:
        raise ValueError(f"--grep is at most {MAX_GREP} characters; this one has {len(pattern)}")
    try:
        re.compile(pattern)  # its errors name the place that is wrong
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"--grep {pattern!r} is not a regular expression: {exc}") from None
    options = _re2.Options()
    options.log_errors = False  # a refused pattern is the caller's error, not a log line
    try:
        compiled: Grep = _re2.compile(pattern, options=options)
    except _re2.error as exc:
        why = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(
            f"--grep {pattern!r} cannot be matched in bounded time ({why}): the daemon "
            "matches without backtracking, so backreferences, lookaround and very large "
            "counted repetitions are not available; write it without them"
        ) from None
    return compiled


class Grep(Protocol):
    def search(self, text: str) -> object: ...


# RE2 (google-re2; no type stubs): linear-time matching.
_re2: Any = importlib.import_module("re2")


@dataclass(frozen=True)
class LogQuery:
    """Which events a ``log`` request wants (everything but ``limit`` and ``after``)."""

    first_seq: int = 1
    earliest: str | None = None  # a ts: events stamped before it are left out
    types: frozenset[str] = frozenset()
    grep: Grep | None = None
    latest: str | None = None  # a ts: events stamped after it are left out (--until)

    @classmethod
    def of(
        cls,
        since: int | str,
        types: list[str],
        grep: str | None,
        now_ns: int,
        until: str | None = None,
    ) -> LogQuery:
        first, earliest = parse_since(since, now_ns)
        latest = parse_until(until, now_ns)
        return cls(first, earliest, frozenset(types), compile_grep(grep), latest)

    # a record of any event type (its data per type), read by key
    def match(self, record: Mapping[str, Any]) -> bool:
        if record["seq"] < self.first_seq or (self.types and record["type"] not in self.types):
            return False
        if self.earliest is not None and record["ts"] < self.earliest:
            return False
        if self.latest is not None and record["ts"] > self.latest:
            return False
        if self.grep is None:
            return True
        # What a person sees of it (its line) and what a program sees (its data).
        if self.grep.search(describe(record)):
            return True
        return self.grep.search(orjson.dumps(record.get("data")).decode()) is not None


def follow(conn: Connection, params: LogRequest) -> Iterator[EventRecord]:
    """Every event a ``log --follow`` asks for, in order and once each.

    When the daemon ends the stream because this reader fell behind (``fell_behind``,
    with ``last_seq``: per session, the seq up to which it dealt with every event),
    catch up with plain ``log`` requests after what was yielded, then follow again
    from there (``after``): nothing is missed and nothing comes twice. Only an
    error of the catching up itself (or any other error) is raised.
    """
    params = params.copy()
    done: dict[str, int] = {}  # per session: the last seq yielded
    while True:
        try:
            for record in conn.stream("log", params):
                done[record["session"]] = record["seq"]
                yield record
            return
        except RemoteError as exc:
            if exc.code != FELL_BEHIND:
                raise
            reported = exc.data.get("last_seq")
            if not isinstance(reported, dict):
                raise
        after = {name: max(int(seq), done.get(name, 0)) for name, seq in reported.items()}
        after.update({name: seq for name, seq in done.items() if name not in after})
        # The last N were shown already; from here on, everything after them.
        catch_up = {**params, "follow": False, "limit": 0}
        asked = params["name"]
        for name in sorted(after) if asked is None else [asked]:
            for record in conn.call("log", {**catch_up, "name": name, "after": after}):
                done[name] = after[name] = record["seq"]
                yield record
        params = {**params, "limit": 0, "after": after}
