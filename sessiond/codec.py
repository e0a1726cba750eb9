"""The line format of a log, event ids and timestamps.

A line is ``<orjson object> <crc32 of the object as 8 lowercase hex>\\n``. The
checksum lets a reader tell a good line from a torn or corrupted one; CRC32
catches every single-byte change and every burst up to 32 bits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NotRequired, TypedDict
from zlib import crc32

import orjson

# A clock returns nanoseconds since the Unix epoch (time.time_ns). Injected so that
# tests and the daemon's test clock control every timestamp written.
Clock = Callable[[], int]


class NodeStamp(TypedDict):
    """Which cluster node wrote an event, under which epoch of its ownership (absent
    in logs of the files backend)."""

    node: str
    epoch: int


class EventRecord(TypedDict):
    """An event as a line holds it (the record ``decode_line`` reads; log/events.py
    has the envelope it validates to)."""

    v: int
    session: str
    seq: int
    id: str
    ts: str
    type: str
    causation: str | None
    correlation: str | None
    # the payload: its shape depends on ``type``, so this one field stays open; the
    # fold and the views take it as their type's TypedDict (log/event_records.py)
    data: dict[str, Any]
    node: NotRequired[str]  # the cluster's NodeStamp
    epoch: NotRequired[int]


CHECKSUM_LEN = 8
TRAILER_LEN = 1 + CHECKSUM_LEN  # b" " + 8 hex digits, before the newline


def frame(body: bytes) -> bytes:
    """One complete line for an encoded event object."""
    return b"%s %08x\n" % (body, crc32(body))


def unframe(line: bytes) -> bytes | None:
    """The object bytes of a line (without its newline), or None if the checksum fails."""
    if len(line) <= TRAILER_LEN or line[-TRAILER_LEN] != 0x20:
        return None
    body = line[:-TRAILER_LEN]
    try:
        want = int(line[-CHECKSUM_LEN:], 16)
    except ValueError:
        return None
    return body if crc32(body) == want else None


# any record: a Record, an upcast old one, a test's own (orjson encodes it whole)
def encode_line(record: Mapping[str, Any]) -> bytes:
    return frame(orjson.dumps(record))


def decode_line(line: bytes) -> EventRecord | None:
    """The record of a good line, or None if the line is torn or corrupt. (Its fields
    are as its writer validated them: the checksum holds.)"""
    body = unframe(line)
    if body is None:
        return None
    try:
        record: EventRecord = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def new_event_id(now_ns: int) -> str:
    """32 hex digits: 48 bits of milliseconds then 80 random bits, so ids sort by time."""
    return f"{(now_ns // 1_000_000) & 0xFFFFFFFFFFFF:012x}{os.urandom(10).hex()}"


class EventIds:
    """Event ids for one writer, cheaper than :func:`new_event_id` per event.

    Same shape (48 bits of milliseconds, then 80 bits), but the 80 bits are a
    random 40-bit prefix drawn once per writer and a 40-bit counter, so making
    an id needs no system call. Unique across writers with overwhelming
    probability, and strictly increasing within one writer.
    """

    __slots__ = ("_count", "_head", "_ms", "_prefix")

    def __init__(self) -> None:
        # Drawn at the first id, not here: a start-up makes a writer for each of
        # thousands of sessions, most of which append nothing for a while (two
        # system calls each, a few per cent of opening one).
        self._prefix = ""
        self._count = 0
        self._ms: int | None = None  # (None: no id made yet)
        self._head = ""

    def next(self, now_ns: int) -> str:
        # Appends come many per millisecond under load: the millisecond and the
        # writer's prefix are formatted once per millisecond, not per event.
        ms = now_ns // 1_000_000
        if ms != self._ms:
            if self._ms is None:
                self._prefix = os.urandom(5).hex()
                self._count = int.from_bytes(os.urandom(4), "big")
            self._ms = ms
            self._head = f"{ms & 0xFFFFFFFFFFFF:012x}{self._prefix}"
        self._count = count = (self._count + 1) & 0xFFFFFFFFFF
        return f"{self._head}{count:010x}"


class Timestamper:
    """Formats nanosecond clocks as RFC 3339 UTC with microseconds, quickly.

    ``time.strftime`` costs more than the rest of an append, so the formatted
    second is cached and only the fraction is formatted per event.
    """

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def format(self, now_ns: int) -> str:
        second, frac_ns = divmod(now_ns, 1_000_000_000)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{frac_ns // 1000:06d}Z"


def rfc3339(now_ns: int) -> str:
    """One-off formatting of a nanosecond clock value (not for hot paths)."""
    return Timestamper().format(now_ns)
