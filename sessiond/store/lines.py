"""Turning drafts into framed lines, and reading framed lines back with verification.

Shared by every backend that stores the line format (the files backend, the
bundle reader), so the rules for a good line live in one place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from zlib import crc32

import orjson

from sessiond.codec import Clock, EventIds, Timestamper, decode_line, frame
from sessiond.events import CURRENT_VERSION
from sessiond.store.base import Draft, LogPosition, Record

# A plain dict: faster than the read-only mapping on a path taken per event.
VERSIONS: dict[str, int] = dict(CURRENT_VERSION)

# Bytes read per call while scanning a log: large enough that Python's per-call
# cost vanishes, small enough to keep memory flat on huge logs.
CHUNK = 8 << 20


class RecordBuilder:
    """Assigns envelope fields and frames events for one log."""

    __slots__ = ("_clock", "_ids", "_session", "_ts")

    def __init__(self, session: str, clock: Clock) -> None:
        self._session = session
        self._clock = clock
        self._ts = Timestamper()
        self._ids = EventIds()

    def build(self, after_seq: int, drafts: Sequence[Draft]) -> tuple[list[Record], bytes]:
        now = self._clock()
        ts = self._ts.format(now)
        records: list[Record] = []
        lines: list[bytes] = []
        seq = after_seq
        dumps = orjson.dumps
        next_id = self._ids.next
        session = self._session
        for data, causation, correlation in drafts:
            seq += 1
            etype = data.EVENT_TYPE
            record = {
                "v": VERSIONS[etype],
                "session": session,
                "seq": seq,
                "id": next_id(now),
                "ts": ts,
                "type": etype,
                "causation": causation,
                "correlation": correlation,
                "data": data.__pydantic_serializer__.to_python(data, mode="json", by_alias=True),
            }
            records.append(record)
            lines.append(frame(dumps(record)))
        return records, b"".join(lines)


@dataclass(slots=True)
class ScanEnd:
    """Where a scan stopped: after the last good line, and what lay beyond it."""

    position: LogPosition
    tail_bytes: int = 0  # bytes after the last good line (a torn write), 0 if none
    tail_reason: str = ""


@dataclass(slots=True)
class BadLine:
    """A line that fails its checksum or breaks seq order."""

    line: int
    offset: int
    why: str


Reader = Callable[[int, int], bytes]  # (size, offset) -> bytes, like os.pread


def scan(
    read: Reader,
    after: LogPosition,
    end: ScanEnd,
    *,
    upto: int | None = None,
    with_lines: bool = False,
) -> Iterator[Any]:
    """Yield the record of every good line after ``after`` (``(record, line)`` pairs
    with ``with_lines``, the line without its newline).

    Stops at the first bad line or at a final segment without a newline, leaving
    ``end`` at the last good line with ``tail_bytes`` set to what follows it; the
    caller then decides between torn tail and corruption (:func:`classify_tail`).
    The seq of every line must be exactly one more than the one before it.
    """
    # Hot loop of every start-up: per line only what must be done per line.
    # Offsets and the last id are worked out when the scan stops, not per line.
    expected = after.seq + 1
    limit = (1 << 62) if upto is None else upto
    data_start = pos = after.offset  # file offset of data[0]; of the next read
    carry = b""
    lines: list[bytes] = []
    done = 0  # lines of `lines` consumed
    prev: Record | None = None
    loads = orjson.loads
    why = ""
    try:
        while True:
            chunk = read(CHUNK, pos)
            if not chunk:
                break
            data = carry + chunk if carry else chunk
            data_start = pos - len(carry)
            pos += len(chunk)
            lines = data.split(b"\n")
            carry = lines.pop()
            done = 0
            for line in lines:
                body = line[:-9]
                try:
                    good = line[-9] == 0x20 and crc32(body) == int(line[-8:], 16)
                    record = loads(body) if good else None
                except (ValueError, IndexError):
                    record = None
                if record is None or record.get("seq") != expected:
                    why = (
                        "checksum does not match"
                        if record is None
                        else f"seq {record.get('seq')!r} where {expected} was expected"
                    )
                    return
                if expected > limit:
                    return
                yield (record, line) if with_lines else record
                prev = record
                done += 1
                expected += 1
    finally:
        offset = data_start + sum(len(line) + 1 for line in lines[:done])
        last_id = after.last_id if prev is None else prev["id"]
        end.position = LogPosition(expected - 1, offset, last_id)
        if why:
            end.tail_bytes = -1  # a bad line: classify_tail() measures from the offset
            end.tail_reason = why
        elif carry and done == len(lines):
            end.tail_bytes = len(carry)
            end.tail_reason = "last line has no newline (torn write)"


def has_good_line(read: Reader, offset: int) -> BadLine | None:
    """Whether any complete good line follows the (bad) line at ``offset``; used to
    tell a torn tail (nothing good after the bad line: a write that never finished)
    from corruption in the middle (good lines after it: damaged at rest)."""
    pos = offset
    carry = b""
    line_no = -1  # the bad line itself is line 0 and is skipped
    while True:
        chunk = read(CHUNK, pos)
        if not chunk:
            return None
        pos += len(chunk)
        data = carry + chunk
        lines = data.split(b"\n")
        carry = lines.pop()
        for line in lines:
            line_no += 1
            if line_no > 0 and decode_line(line) is not None:
                return BadLine(line=line_no, offset=pos, why="good line after a bad one")


# A torn write is at most one batch of appends; more unreadable bytes than this at
# the end of a log are not a torn write.
TORN_LIMIT = 64 << 20
TRAILER = re.compile(rb" [0-9a-f]{8}")


def classify_tail(read: Reader, end: ScanEnd, size: int) -> BadLine | None:
    """After :func:`scan` stopped: the corruption to report, or None for a torn tail
    (``end.tail_bytes`` then says how many bytes to cut).

    A torn tail is what an unfinished write leaves: part of one line, or blocks
    the file system never filled (zeros). It is told from damage at rest by what
    follows and what it holds: a good line after the bad one, or a complete event
    inside the bad bytes (a line whose newline was damaged), means corruption.
    """
    if not end.tail_bytes:
        return None
    at = end.position.offset
    line = end.position.seq + 1
    if end.tail_bytes == -1 and has_good_line(read, at) is not None:
        return BadLine(line=line, offset=at, why=end.tail_reason)
    if size - at > TORN_LIMIT:
        return BadLine(
            line, at, f"{size - at} unreadable bytes at the end: too many for a torn write"
        )
    for segment in read(size - at, at).split(b"\n"):
        if _embeds_event(segment):
            return BadLine(line, at, "a complete event is damaged (its line break or neighbour)")
    end.tail_bytes = size - at
    return None


def _embeds_event(segment: bytes) -> bool:
    """Whether ``segment`` holds a complete event other than itself as a whole (a
    torn write may lack only the newline of its line; that one is not an event)."""
    for m in TRAILER.finditer(segment):
        if m.end() < len(segment) and decode_line(segment[: m.end()]) is not None:
            return True
    start = segment.find(b'{"v":', 1)
    while start > 0:
        if decode_line(segment[start:]) is not None:
            return True
        start = segment.find(b'{"v":', start + 1)
    return False
