"""The line format, ids and timestamps."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from sessiond.codec import EventIds, Timestamper, decode_line, frame, new_event_id, unframe


@given(st.binary(min_size=1, max_size=200).filter(lambda b: b"\n" not in b))
def test_a_framed_line_unframes_to_its_body(body: bytes) -> None:
    line = frame(body)
    assert line.endswith(b"\n")
    assert unframe(line[:-1]) == body


@given(st.binary(min_size=2, max_size=100).filter(lambda b: b"\n" not in b), st.data())
def test_any_single_byte_change_fails_the_checksum(body: bytes, data: st.DataObject) -> None:
    line = bytearray(frame(body)[:-1])
    index = data.draw(st.integers(0, len(line) - 1))
    flip = data.draw(st.integers(1, 255))
    line[index] ^= flip
    assert unframe(bytes(line)) is None


def test_lines_that_are_not_objects_are_not_records() -> None:
    assert decode_line(frame(b"[1,2]")[:-1]) is None
    assert decode_line(frame(b"{not json")[:-1]) is None
    assert decode_line(b"") is None
    assert decode_line(b"{} zzzzzzzz") is None


def test_event_ids_are_unique_and_sort_by_time() -> None:
    ids = EventIds()
    now = time.time_ns()
    made = [ids.next(now + i * 1_000_000) for i in range(1000)]
    assert len(set(made)) == 1000
    assert made == sorted(made)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in made)
    other = EventIds()
    assert other.next(now) != ids.next(now)
    assert len(new_event_id(now)) == 32


def test_event_ids_drawn_at_the_first_one_are_whole_and_rise_within_a_millisecond() -> None:
    # the writer's random part is drawn at its first id (not when it is made): the
    # first id of any clock, even the epoch's first millisecond, is a whole one
    for now in (0, time.time_ns()):
        ids, other = EventIds(), EventIds()
        made = [ids.next(now) for _ in range(100)]
        assert all(len(i) == 32 for i in made)
        assert made == sorted(made)
        assert len(set(made)) == 100
        assert other.next(now)[12:22] != made[0][12:22]  # another writer's prefix


@given(st.integers(0, 4_102_444_800 * 10**9))
def test_timestamps_are_rfc3339_utc_with_microseconds(now_ns: int) -> None:
    text = Timestamper().format(now_ns)
    assert text.endswith("Z")
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert parsed.tzinfo == UTC
    expected = datetime.fromtimestamp(now_ns // 1000 / 1_000_000, UTC)
    assert parsed == expected


def test_the_timestamper_cache_follows_the_second() -> None:
    ts = Timestamper()
    a = ts.format(1_700_000_000_999_999_000)
    b = ts.format(1_700_000_001_000_000_000)
    assert a == "2023-11-14T22:13:20.999999Z"
    assert b == "2023-11-14T22:13:21.000000Z"
