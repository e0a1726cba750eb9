"""The `log` filters (sessiond.logquery) and the follower's bounded buffer, as pure logic."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from sessiond.ipc.follow import Buffer
from sessiond.log.store.base import Record
from sessiond.logquery import LogQuery, compile_grep, parse_since

NOW = 1_764_583_200 * 10**9  # 2025-12-01T10:00:00Z


def record(seq: int, ts: str = "2025-12-01T09:30:00.000000Z", text: str = "hi") -> Record:
    data = {"text": text, "sender": "me"}
    # only what a query reads: not a whole record
    return cast(Record, {"seq": seq, "ts": ts, "type": "message.received", "session": "s",
                         "data": data})  # fmt: skip


@pytest.mark.parametrize(
    ("since", "want"),
    [
        (7, (7, None)),
        ("10m", (1, "2025-12-01T09:50:00.000000Z")),
        ("1h30m", (1, "2025-12-01T08:30:00.000000Z")),
        ("2025-12-01T11:00:00+02:00", (1, "2025-12-01T09:00:00.000000Z")),
        ("2025-12-01T09:00:00Z", (1, "2025-12-01T09:00:00.000000Z")),
    ],
)
def test_since_is_a_seq_or_a_time(since: int | str, want: tuple[int, str | None]) -> None:
    assert parse_since(since, NOW) == want


@pytest.mark.parametrize(
    ("since", "needle"),
    [(0, "start at 1"), ("5", "JSON integer"), ("soon", "'soon'"), ("+1m", "'+1m'"),
     ("2025-12-01T09:00:00", "UTC offset"), ("36501d", "100 years"), (True, "True")],
)  # fmt: skip
def test_a_bad_since_names_itself(since: Any, needle: str) -> None:
    with pytest.raises(ValueError, match="since") as info:
        parse_since(since, NOW)
    assert needle in str(info.value)


def test_grep_matches_the_line_or_the_data_and_a_bad_one_is_named() -> None:
    q = LogQuery.of(1, [], "from me", NOW)  # describe(): "from me: hi"
    assert q.match(record(1))
    assert LogQuery.of(1, [], '"sender":"me"', NOW).match(record(1))  # the data as JSON
    assert not LogQuery.of(1, [], "nobody", NOW).match(record(1))
    with pytest.raises(ValueError, match=r"'\[a' is not a regular expression"):
        compile_grep("[a")
    with pytest.raises(ValueError, match="at most 1024"):
        compile_grep("a" * 1025)


def test_the_query_ands_seq_time_and_type() -> None:
    q = LogQuery.of("10m", ["message.received"], None, NOW)
    assert q.match(record(1, ts="2025-12-01T09:55:00.000000Z"))
    assert not q.match(record(1, ts="2025-12-01T09:45:00.000000Z"))
    assert not LogQuery.of(5, [], None, NOW).match(record(4))
    assert not LogQuery.of(1, ["run.finished"], None, NOW).match(record(4))


def test_the_buffer_holds_at_most_its_bound_then_remembers_only_the_first_missed() -> None:
    async def go() -> None:
        b = Buffer(3, None)
        for seq in range(1, 4):
            b.push("s", record(seq))
        assert await b.next() == ("s", record(1))
        for seq in range(4, 6):  # 2, 3, 4 held; 5 is one too many
            b.push("s", record(seq))
        b.push("t", record(9))
        assert not b.pending  # what was held is let go at once
        assert b.missed == {"s": 2, "t": 9}
        assert await b.next() is None

    asyncio.run(go())


def test_a_buffer_of_one_session_ignores_the_others() -> None:
    b = Buffer(1, "s")
    b.push("t", record(1))
    b.push("t", record(2))
    assert not b.pending
    assert b.missed is None
