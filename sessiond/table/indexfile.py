"""Reading the table index and checking it against the logs, on the standard
library and orjson alone.

A starting daemon serves ``ping`` and ``ps`` from this before it has imported
anything else (sessiond.daemon.early), so this module imports nothing heavy:
no pydantic, no structlog, no store. sessiond.table.index keeps the index up to
date and says what an entry means; this is the read half.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

import orjson

from sessiond.errors import SessiondError, StorageError
from sessiond.log.store.durable import read_regular
from sessiond.names import check_name

# typing is imported for mypy alone: at run time it costs the early server's
# first answer ~2 ms, and a TypedDict is the dict it types (Read: below)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple, NotRequired, TypedDict

    from sessiond.replies import PsRow
else:
    TypedDict = dict

INDEX_NAME = "table.index"
VERSION = 1
HEADER = orjson.dumps({"sessiond-index": VERSION}) + b"\n"
LIMIT = 1 << 30  # bytes: an index bigger than this is not one the daemon wrote
# A session folder's log and spec, as sessiond.log.store.files names them (that
# module loads the whole store; tests/table/test_index.py checks both agree).
LOG_NAME = "events.jsonl"
SPEC_NAME = "spec.toml"

Stamp = list[int]  # [inode, size, mtime_ns] of a regular file
# What is worth a warning in the daemon's log (event, fields): the reader logs
# nothing itself (structlog is not loaded when the early server reads the index).
Warn = Callable[[str, Mapping[str, object]], None]


# The JSON types of a ps row's fields that may be null (sessiond.replies.PsRow, as
# sessiond.table.sessions.summary makes it): text, or a number (pid). ps sorts,
# filters and prints rows by these before anything else could check them (the
# early server, before the daemon has imported its models): an entry whose row
# holds anything else is not one the daemon wrote, and is skipped like a torn line.
_TEXT = (str, type(None))
_NUMBER = (int, type(None))


class Entry(TypedDict):
    name: str
    seq: int
    log: Stamp
    spec: Stamp | None
    busy: bool  # work in flight: the session is opened (and recovered) first
    wake_at: float | None  # the next timed wake (seconds since the epoch), if armed
    row: PsRow
    # Whether its spec has triggers (watch, git, [bind], cron, every: armed from the
    # open session): such a session is opened before the start-up is done. An index
    # written before this field has none: read as true.
    triggers: NotRequired[bool]
    # Its program's workspace (run.cwd; None: no program): what a run of another
    # session hides (sessiond.runs.context). Absent in an older index: opened first.
    workspace: NotRequired[str | None]
    # What its model replies cost by UTC day ("YYYY-MM-DD": [tokens, cost]): what
    # its agent's daily budget counts (sessiond.gateway.budgets). Written only for
    # a session with a spec; absent (an older index, no spec): opened to count it.
    spend: NotRequired[dict[str, list[float]]]


def stamp(path: str) -> Stamp | None:
    """The identity of the regular file at ``path`` (a symlink is none: its
    session is opened from its log, which refuses it with the reason)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _entry(raw: Any) -> Entry | None:
    """``raw`` as an entry, or None when it is not one (the line is skipped)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None
    try:
        check_name(raw["name"])
    except SessiondError:  # a name the daemon never wrote
        return None
    row, log_stamp, spec_stamp = raw.get("row"), raw.get("log"), raw.get("spec")
    if not isinstance(row, dict) or row.get("name") != raw["name"] or not _is_row(row):
        return None
    if not _is_stamp(log_stamp) or not (spec_stamp is None or _is_stamp(spec_stamp)):
        return None
    if not isinstance(raw.get("seq"), int) or not isinstance(raw.get("busy"), bool):
        return None
    wake_at = raw.get("wake_at")
    if wake_at is not None and not isinstance(wake_at, int | float):
        return None
    if not isinstance(raw.get("triggers", True), bool):
        return None
    if not isinstance(raw.get("workspace"), str | None):
        return None
    return raw  # type: ignore[return-value]  # checked field by field above


def _is_row(row: Mapping[str, object]) -> bool:
    """Whether every field of ``row`` is there with a type a ps row's has (exact
    types: JSON has no subclasses, and a bool is no priority). Unrolled, as
    _is_stamp: this runs for each of thousands of entries before the first answer."""
    get = row.get
    labels = get("labels")
    return (
        type(get("state")) is str
        and type(get("agent")) is str
        and type(get("priority")) is int
        and type(get("runs")) is int
        and type(get("reason", 0)) in _TEXT
        and type(get("last_active", 0)) in _TEXT
        and type(get("next_wake", 0)) in _TEXT
        and type(get("parent", 0)) in _TEXT
        and type(get("outcome", 0)) in _TEXT
        and type(get("pid", "")) in _NUMBER
        and type(labels) is dict
        and all(type(v) is str for v in labels.values())
    )


def _is_stamp(value: Any) -> bool:
    # unrolled: this runs twice for each of thousands of entries before the first answer
    return (
        type(value) is list
        and len(value) == 3
        and type(value[0]) is int
        and type(value[1]) is int
        and type(value[2]) is int
    )


def _silent(_event: str, _fields: Mapping[str, object]) -> None:
    pass


def read_index(path: Path, warn: Warn = _silent) -> tuple[dict[str, Entry], int]:
    """The entries of the index at ``path`` (empty when there is none or it is not
    ours), and how many lines it holds."""
    try:
        raw = read_regular(path, limit=LIMIT)
    except FileNotFoundError:
        return {}, 0
    except (OSError, StorageError) as exc:
        warn("index.unreadable", {"path": str(path), "why": str(exc)})
        return {}, 0
    lines = raw.split(b"\n")
    if not lines or lines[0] + b"\n" != HEADER:
        if raw:
            warn("index.ignored", {"path": str(path), "why": "not a version 1 index"})
        return {}, 0
    entries: dict[str, Entry] = {}
    skipped = count = 0
    for line in lines[1:]:
        if not line:
            continue
        count += 1
        try:
            entry = _entry(orjson.loads(line))
        except orjson.JSONDecodeError:
            entry = None
        if entry is None:
            skipped += 1
            continue
        entries[entry["name"]] = entry
    if skipped:
        warn("index.lines_skipped", {"path": str(path), "lines": skipped})
    return entries, count


class Plan(TypedDict):
    """What a start-up opens first (``first``: stale, missing, or busy), and the
    rest, listed from the index until opened (in the order they are opened: the
    soonest timed wake first)."""

    first: list[str]
    rest: dict[str, Entry]


def plan(sessions_dir: Path, entries: dict[str, Entry]) -> Plan:
    """Check every session folder against its entry: the log wins."""
    try:
        names = os.listdir(sessions_dir)
    except FileNotFoundError:
        names = []
    base = str(sessions_dir)
    first: list[str] = []
    fresh: list[Entry] = []
    for name in sorted(names):
        if name[0] == ".":
            continue
        log_path = f"{base}/{name}/{LOG_NAME}"
        log_stamp = stamp(log_path)
        if log_stamp is None and not os.path.lexists(log_path):
            continue  # not a session (the store lists the same: a log or a symlink)
        entry = entries.get(name)
        if (
            entry is None
            or entry["busy"]
            or log_stamp is None
            or entry["log"] != log_stamp
            or entry["spec"] != stamp(f"{base}/{name}/{SPEC_NAME}")
        ):
            first.append(name)
        else:
            fresh.append(entry)
    fresh.sort(key=lambda e: (e["wake_at"] is None, e["wake_at"] or 0.0, e["name"]))
    return {"first": first, "rest": {e["name"]: e for e in fresh}}


if TYPE_CHECKING:

    class Read(NamedTuple):
        """The index read and checked against the logs by the early server, handed to
        the full start so that it does not read and check it a second time (0.16 s at
        10,000 sessions). Still true then: the state dir's lock was taken before the
        read, and only its holder writes a log or a spec (a create cut off by a crash
        left a ``.new-`` folder, which the plan skips as it skips any dot name)."""

        path: Path  # the index read
        sessions_dir: Path  # the folders checked against it
        entries: dict[str, Entry]
        lines: int  # entry lines in the file
        planned: Plan
        warnings: list[tuple[str, Mapping[str, object]]]  # for the daemon's log, once it has one

else:  # the same fields, without typing (tests/test_early_config.py checks they agree)
    from collections import namedtuple

    Read = namedtuple("Read", "path sessions_dir entries lines planned warnings")


def read_checked(path: Path, sessions_dir: Path) -> Read:
    """Read the index at ``path`` and check it against ``sessions_dir``."""
    warnings: list[tuple[str, Mapping[str, object]]] = []
    entries, lines = read_index(path, lambda event, fields: warnings.append((event, fields)))
    return Read(path, sessions_dir, entries, lines, plan(sessions_dir, entries), warnings)
