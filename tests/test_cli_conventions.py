"""Unit tests of what `sessionctl ps` and `log` parse and print (issue 26): the
listing rules both ends share, cut cells, relative times, did-you-mean, the
command's own usage, and human lines with no `None`, `by -` or contradiction."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sessiond.ctl import main
from sessiond.ctl.ps import rows_table
from sessiond.ctl.render import cut
from sessiond.describe import describe
from sessiond.listing import HIDE_TERMINATED_AFTER, Listing, suggest
from sessiond.logquery import LogQuery, absolute, parse_until

NOW = 2_000_000_000.0


def _row(name: str, state: str = "sleeping", agent: str = "", **more: object) -> Any:
    return {"name": name, "state": state, "agent": agent, "priority": 0, "labels": {},
            "last_active": "2033-05-18T03:33:20.000000Z", **more}  # fmt: skip


def test_a_state_list_may_be_repeated_or_comma_separated_and_a_typo_is_named() -> None:
    assert Listing.of(["blocked,ready", "running"]).states == {"blocked", "ready", "running"}
    with pytest.raises(ValueError, match="did you mean 'blocked'"):
        Listing.of(["blokced"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        Listing.of(labels=["team"])
    with pytest.raises(ValueError, match="did you mean 'name'"):
        Listing.of(sort="nmae")


def test_terminated_long_ago_hides_unless_all_or_asked_for() -> None:
    old = _row("old", "terminated", last_active="2000-01-01T00:00:00.000000Z")
    new = _row("new", "terminated", last_active=time.strftime("%Y-%m-%dT%H:%M:%S.000000Z"))
    now = time.time()
    assert Listing().apply([old, new], now) == ([new], 1)
    assert Listing(all=True).apply([old, new], now)[1] == 0
    assert Listing.of(["terminated"]).apply([old, new], now) == ([new, old], 0)
    assert HIDE_TERMINATED_AFTER == 3600


def test_orders_group_by_agent_by_default() -> None:
    rows = [_row("b", agent="y"), _row("a", agent="z"), _row("c", agent="y", state="blocked")]
    assert [r["name"] for r in Listing().order(rows)] == ["b", "c", "a"]
    assert [r["name"] for r in Listing(sort="state").order(rows)] == ["c", "a", "b"]
    labelled = [_row("x", labels={"team": "red"}), _row("y", labels={"team": "blue"})]
    assert Listing.of(labels=["team=red"]).apply(labelled, NOW)[0] == [labelled[0]]


def test_cells_are_cut_with_an_ellipsis_only_when_asked() -> None:
    reason = "r" * 100
    assert cut(reason, 60, full=False) == "r" * 59 + "…"
    assert cut(reason, 60, full=True) == reason
    row: Any = {**_row("s"), "reason": reason, "runs": 0, "next_wake": None, "outcome": None}
    assert rows_table([row], full=True)[1][-1] == reason
    assert rows_table([row], full=False)[1][-1].endswith("…")


def test_relative_times_and_until() -> None:
    now_ns = int(NOW * 1e9)
    assert absolute("-1h", now_ns) == absolute("1h", now_ns) == "2033-05-18T02:33:20.000000Z"
    today = absolute("today", now_ns)
    yesterday = absolute("yesterday", now_ns)
    assert today is not None
    assert yesterday is not None
    assert yesterday < today <= "2033-05-18T03:33:20.000000Z"
    assert parse_until("now", now_ns) == "2033-05-18T03:33:20.000000Z"
    with pytest.raises(ValueError, match="until"):
        parse_until("5", now_ns)
    q = LogQuery.of(1, [], None, now_ns, until="-1h")
    assert q.match({"seq": 1, "type": "x", "ts": "2033-05-18T01:00:00.000000Z"})
    assert not q.match({"seq": 2, "type": "x", "ts": "2033-05-18T03:00:00.000000Z"})


def test_a_typo_gets_a_did_you_mean_and_the_commands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["shwo", "x"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "did you mean 'show'" in err
    assert "activate" not in err
    with pytest.raises(SystemExit):
        main(["ps", "--bogus"])
    assert capsys.readouterr().err.startswith("usage: sessionctl ps ")
    with pytest.raises(SystemExit):
        main(["ps", "--staet", "blocked"])
    assert "did you mean '--state'" in capsys.readouterr().err
    assert main(["log", "x", "--since", "tomorrow"]) == 2
    assert capsys.readouterr().err.startswith("usage: sessionctl log ")
    assert suggest("zzz", ["ps"]) == ""


@pytest.mark.parametrize(
    ("kind", "data", "bad"),
    [
        ("run.finished", {"run": 1, "status": "killed", "exit_code": None, "duration_ms": 3},
         "None"),
        ("policy.decided", {"tool": "read", "call": "c1", "decision": "allow",
                            "rule": "default: none allowed"}, "none allowed"),
        ("approval.granted", {"tool": "t", "call": "c1", "by": "", "uid": None,
                              "user": "notify:ops", "channel": "link"}, "by -"),
        ("lifecycle.changed", {"from": None, "to": "created", "outcome": None,
                               "reason": None}, "- ->"),
        ("tool.finished", {"tool": "t", "call": "c1", "status": "ok", "exit_code": None,
                           "hashes": {}}, ": -"),
    ],
)  # fmt: skip
def test_human_lines_say_no_none_dash_or_contradiction(
    kind: str, data: dict[str, object], bad: str
) -> None:
    line = describe({"type": kind, "data": data})
    assert bad not in line
    assert line
    if kind == "approval.granted":
        assert "notify:ops" in line
