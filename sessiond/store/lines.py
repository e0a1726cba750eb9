"""Turning drafts into framed lines, and reading framed lines back with verification.

Shared by every backend that stores the line format (the files backend, the
bundle reader), so the rules for a good line live in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from zlib import crc32

import orjson

from sessiond.codec import TRAILER_LEN, Clock, Timestamper, decode_line, frame, new_event_id
from sessiond.event_data import dump_data
from sessiond.events import CURRENT_VERSION
from sessiond.store.base import Draft, LogPosition, Record

# Bytes read per call while scanning a log: large enough that Python's per-call
# cost vanishes, small enough to keep memory flat on huge logs.
CHUNK = 8 << 20


class RecordBuilder:
    """Assigns envelope fields and frames events for one log."""

    __slots__ = ("_clock", "_session", "_ts")

    def __init__(self, session: str, clock: Clock) -> None:
        self._session = session
        self._clock = clock
        self._ts = Timestamper()

    def build(self, after_seq: int, drafts: Sequence[Draft]) -> tuple[list[Record], bytes]:
        now = self._clock()
        ts = self._ts.format(now)
        records: list[Record] = []
        lines: list[bytes] = []
        seq = after_seq
        dumps = orjson.dumps
        for draft in drafts:
            seq += 1
            data = draft.data
            etype = data.EVENT_TYPE
            record = {
                "v": CURRENT_VERSION[etype],
                "session": self._session,
                "seq": seq,
                "id": new_event_id(now),
                "ts": ts,
                "type": etype,
                "causation": draft.causation,
                "correlation": draft.correlation,
                "data": dump_data(data),
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
) -> Iterator[tuple[Record, bytes]]:
    """Yield ``(record, line)`` for every good line after ``after``.

    Stops at the first bad line or at a final segment without a newline, leaving
    ``end`` at the last good line with ``tail_bytes`` set to what follows it; the
    caller then decides between torn tail and corruption (:func:`classify_tail`).
    The seq of every line must be exactly one more than the one before it.
    """
    expected = after.seq + 1
    offset = after.offset
    last_id = after.last_id
    pos = offset
    carry = b""
    loads = orjson.loads
    try:
        while True:
            chunk = read(CHUNK, pos)
            if not chunk:
                break
            pos += len(chunk)
            data = carry + chunk if carry else chunk
            lines = data.split(b"\n")
            carry = lines.pop()
            for line in lines:
                body = line[:-TRAILER_LEN]
                try:
                    good = line[-TRAILER_LEN] == 0x20 and crc32(body) == int(line[-8:], 16)
                    record = loads(body) if good else None
                except (ValueError, IndexError):
                    record = None
                if record is None or record.get("seq") != expected:
                    end.position = LogPosition(expected - 1, offset, last_id)
                    end.tail_bytes = -1  # unknown yet: the caller measures from offset
                    end.tail_reason = (
                        "checksum does not match"
                        if record is None
                        else f"seq {record.get('seq')!r} where {expected} was expected"
                    )
                    return
                if upto is not None and expected > upto:
                    end.position = LogPosition(expected - 1, offset, last_id)
                    return
                yield record, line
                offset += len(line) + 1
                last_id = record["id"]
                expected += 1
    finally:
        if end.tail_bytes == 0:
            end.position = LogPosition(expected - 1, offset, last_id)
    if carry:
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


def classify_tail(read: Reader, end: ScanEnd, size: int) -> BadLine | None:
    """After :func:`scan` stopped: the corruption to report, or None for a torn tail
    (``end.tail_bytes`` then says how many bytes to cut)."""
    at = end.position.offset
    if end.tail_bytes == -1:
        if has_good_line(read, at) is not None:
            return BadLine(line=end.position.seq + 1, offset=at, why=end.tail_reason)
        end.tail_bytes = size - at
    return None
