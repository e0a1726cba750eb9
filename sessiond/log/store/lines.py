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

from sessiond.codec import Clock, EventIds, NodeStamp, Timestamper, decode_line, frame
from sessiond.log.dump import dump_data
from sessiond.log.event_data import EventData
from sessiond.log.events import CURRENT_VERSION
from sessiond.log.store.base import Draft, LogPosition, Record

# A plain dict: faster than the read-only mapping on a path taken per event.
VERSIONS: dict[str, int] = dict(CURRENT_VERSION)

# Bytes read per call while scanning a log: large enough that Python's per-call
# cost vanishes, small enough to keep memory flat on huge logs.
CHUNK = 8 << 20


class RecordBuilder:
    """Assigns envelope fields and frames events for one log."""

    __slots__ = ("_clock", "_ids", "_session", "_ts", "stamp")

    def __init__(self, session: str, clock: Clock) -> None:
        self._session = session
        self._clock = clock
        self._ts = Timestamper()
        self._ids = EventIds()
        # Optional envelope fields every event gets (the cluster's node and epoch,
        # docs/design.md section 10); None for the files backend, so its lines are as
        # they always were.
        self.stamp: NodeStamp | None = None

    def build_one(
        self,
        after_seq: int,
        data: EventData,
        causation: str | None = None,
        correlation: str | None = None,
    ) -> tuple[Record, bytes]:
        """One event's record and line: most appends are one event, and this path
        builds no list of drafts, records or lines for it."""
        now = self._clock()
        etype = data.EVENT_TYPE
        record: Record = {
            "v": VERSIONS[etype],
            "session": self._session,
            "seq": after_seq + 1,
            "id": self._ids.next(now),
            "ts": self._ts.format(now),
            "type": etype,
            "causation": causation,
            "correlation": correlation,
            "data": dump_data(data),
        }
        if stamp := self.stamp:
            record["node"] = stamp["node"]
            record["epoch"] = stamp["epoch"]
        return record, frame(orjson.dumps(record))

    def build(self, after_seq: int, drafts: Sequence[Draft]) -> tuple[list[Record], bytes]:
        if len(drafts) == 1:
            record, line = self.build_one(after_seq, *drafts[0])
            return [record], line
        now = self._clock()
        stamp = self.stamp
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
                "data": dump_data(data),
            }
            if stamp:
                record["node"] = stamp["node"]
                record["epoch"] = stamp["epoch"]
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
                    # not a dict (a good checksum over something else): TypeError
                    in_order = record is not None and record["seq"] == expected
                except (ValueError, IndexError, TypeError, KeyError):
                    record, in_order = None, False
                if not in_order:
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


# A torn write is at most one batch of appends; more unreadable bytes than this at
# the end of a log are not a torn write.
TORN_LIMIT = 64 << 20
TRAILER = re.compile(rb" [0-9a-f]{8}")
# Blocks a crash left unfilled read back as zeros; a run this long is never text
# (a flipped bit may make one NUL byte, never eight in a row).
ZEROS = b"\0" * 8


def classify_tail(read: Reader, end: ScanEnd, size: int) -> BadLine | None:
    """After :func:`scan` stopped: the corruption to report, or None for a torn tail
    (``end.tail_bytes`` then says how many bytes to cut).

    A write that never finished leaves either part of a line without its newline
    (the newline is the last byte of every write), or blocks the file system never
    filled (runs of zeros) — possibly with later blocks of the same unfinished
    write after them, which were never acknowledged either. Anything else is
    damage at rest and is reported, never cut: a complete line that fails its
    checksum, a line with a good checksum and the wrong seq, or an unfinished last
    line that holds a complete event (a damaged line break).
    """
    if not end.tail_bytes:
        return None
    at = end.position.offset
    line = end.position.seq + 1
    first = _first_segment(read, at)
    if first is None:
        return BadLine(line, at, f"more than {TORN_LIMIT} unreadable bytes: not a torn write")
    if ZEROS in first:
        end.tail_bytes = size - at
        end.tail_reason = "zero-filled blocks: a write the crash left unfinished"
        return None
    if first.endswith(b"\n"):
        return BadLine(line, at, end.tail_reason or "the line fails its checksum")
    if _embeds_event(first):
        return BadLine(line, at, "a complete event is damaged (its line break or neighbour)")
    end.tail_bytes = size - at
    end.tail_reason = end.tail_reason or "last line has no newline (torn write)"
    return None


def _first_segment(read: Reader, offset: int) -> bytes | None:
    """The bytes from ``offset`` through the next newline (or to the end of the file)."""
    parts: list[bytes] = []
    pos = offset
    total = 0
    while total <= TORN_LIMIT:
        chunk = read(min(CHUNK, TORN_LIMIT + 1 - total), pos)
        if not chunk:
            return b"".join(parts)
        newline = chunk.find(b"\n")
        if newline >= 0:
            parts.append(chunk[: newline + 1])
            return b"".join(parts)
        parts.append(chunk)
        pos += len(chunk)
        total += len(chunk)
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
