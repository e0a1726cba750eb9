"""Serve at once, then load: the daemon answers from its table index while it opens
its sessions in the background (docs/design.md, "Start-up").

The test-only hold ``fault_hold = "open-rest"`` stops the background load right
after the daemon starts serving, until a file exists: everything here is asked
while the sessions the index vouches for are not opened yet. Nothing waits on
time: on the daemon's own log lines, and on the logs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.harness import Daemon, held_daemon, wait_for

PLAIN = 'name = "{name}"\n[run]\nexec = ["true"]\n'
CRON = PLAIN + '[[trigger]]\ntype = "cron"\nschedule = "0 3 * * *"\n'
LONG = (
    'name = "{name}"\n[run]\nexec = ["sleep", "600"]\nidempotency = "unsafe"\n'
    'resume = "require-user-confirmation"\nretries = 0\n'
)


@pytest.fixture
def held() -> Iterator[Daemon]:
    with held_daemon("open-rest") as d:
        yield d.start()


def create(d: Daemon, name: str, text: str = PLAIN) -> None:
    d.ctl("create", str(d.write_spec(name, text.format(name=name))), check=True)


def restart_held(d: Daemon) -> dict[str, Any]:
    """Start again with the background load held; return its ``index.read`` line
    once the socket serves."""
    (d.root / "go").unlink(missing_ok=True)
    since = len(d.lines)
    d.start(wait=False)
    d.wait_line("daemon.serving", since=since)
    return d.wait_line("index.read", since=since)


def release(d: Daemon) -> None:
    since = len(d.lines)
    (d.root / "go").touch()
    d.wait_line("daemon.ready", since=since)


def still_loading(d: Daemon, since: int) -> bool:
    return not any(line.get("event") == "daemon.ready" for line in d.lines[since:])


def index(d: Daemon) -> Path:
    return d.state_dir / "table.index"


def test_ps_while_loading_is_exact_even_for_a_log_past_its_entry(held: Daemon) -> None:
    d = held
    for name in ("a", "b", "c"):
        create(d, name)
    create(d, "timer", CRON)
    d.ctl("activate", "c", check=True)
    wait_for(lambda: d.json("show", "c")["state"] == "terminated", what="c to finish")
    d.stop()
    old_index = index(d).read_bytes()  # every session as it is now
    d.start()
    d.ctl("suspend", "b", check=True)  # b's log moves past its entry in old_index
    d.kill9()
    index(d).write_bytes(old_index)  # as if the crash came before the index's batch
    since = len(d.lines)
    read = restart_held(d)
    assert (read["listed"], read["opened_first"]) == (3, 1)  # b: its log moved on
    assert d.json("ping")["sessions"] == 4
    rows = d.json("ps", "--all")
    by_name = {r["name"]: r for r in rows}
    assert by_name["b"]["state"] == "suspended"  # the log wins over the index
    assert by_name["c"]["state"] == "terminated"
    assert by_name["timer"]["next_wake"] is not None
    assert still_loading(d, since)  # all of that was served from the index
    release(d)
    assert d.json("ps", "--all") == rows  # once everything is open: the same rows


def test_a_request_naming_a_session_not_opened_yet_gets_the_right_answer(held: Daemon) -> None:
    d = held
    create(d, "a")
    create(d, "timer", CRON)
    d.ctl("suspend", "a", check=True)
    shown = {name: d.json("show", name) for name in ("a", "timer")}
    d.stop()
    since = len(d.lines)
    assert restart_held(d)["listed"] == 2
    for name, before in shown.items():
        now = d.json("show", name)  # opened for this request, out of the load's order
        assert {k: now[k] for k in ("name", "state", "reason", "runs", "seq")} == {
            k: before[k] for k in ("name", "state", "reason", "runs", "seq")
        }
    assert d.json("log", "a", "--type", "lifecycle.changed")[-1]["data"]["to"] == "suspended"
    refused = d.ctl("show", "nosuch")
    assert refused.returncode != 0
    assert "no session 'nosuch'" in refused.stderr
    assert still_loading(d, since)
    release(d)


def test_a_kill_9_during_the_background_load_loses_nothing(held: Daemon) -> None:
    d = held
    for name in ("a", "b", "c"):
        create(d, name)
    create(d, "long", LONG)
    d.ctl("activate", "long", check=True)
    wait_for(lambda: d.json("show", "long")["state"] == "running", what="long to run")
    d.kill9()  # with a run in flight: work the next start recovers before serving
    since = len(d.lines)
    read = restart_held(d)
    assert read["opened_first"] >= 1  # long: busy in its entry, or past it
    assert d.json("show", "long")["state"] != "running"  # its cut-off recorded first
    # served meanwhile: each request opens the session it names, and appends
    d.ctl("send", "a", "hello while loading", check=True)
    d.ctl("suspend", "b", check=True)
    assert still_loading(d, since)
    during = {r["name"]: r["state"] for r in d.json("ps", "--all")}
    d.kill9()  # during the background load
    (d.root / "go").touch()
    d.start()
    sent = d.json("log", "a", "--type", "message.received")
    assert [r["data"]["text"] for r in sent] == ["hello while loading"]
    after = d.json("ps", "--all")
    assert {r["name"]: r["state"] for r in after} == during
    assert during["b"] == "suspended"
    # and the logs alone say the same: a start without the index
    d.stop()
    index(d).unlink()
    d.start()
    assert d.json("ps", "--all") == after


def test_a_timed_wake_fires_before_the_load_reaches_its_session(held: Daemon) -> None:
    d = held
    create(d, "tick", PLAIN + '[[trigger]]\ntype = "every"\ninterval = "2s"\n')
    wait_for(lambda: d.json("show", "tick")["runs"] >= 1, what="tick's first run")
    d.stop()
    since = len(d.lines)
    restart_held(d)
    runs = next(r for r in d.json("ps", "--all") if r["name"] == "tick")["runs"]
    # ps opens nothing: the session is opened by its wake, and runs while the load holds
    wait_for(
        lambda: next(r for r in d.json("ps", "--all") if r["name"] == "tick")["runs"] > runs,
        what="tick to run again",
    )
    assert still_loading(d, since)
    release(d)


def test_the_early_servers_index_read_is_the_full_starts(held: Daemon) -> None:
    # The full start takes the index as the early server read and checked it (no
    # second read): a log past its entry is still recovered first, and what the
    # early server added to the rows for its answers never reaches the index.
    d = held
    create(d, "a")
    create(d, "b")
    d.stop()
    old_index = index(d).read_bytes()
    d.start()
    d.ctl("suspend", "b", check=True)  # b's log moves past its entry in old_index
    d.kill9()
    index(d).write_bytes(old_index)
    read = restart_held(d)
    assert read["early"] is True  # read once, by the early server
    assert (read["listed"], read["opened_first"]) == (1, 1)  # b: recovered first
    assert {r["name"]: r["state"] for r in d.json("ps", "--all")} == {
        "a": "created",
        "b": "suspended",
    }
    d.stop()  # a is still not opened: its entry goes back as it was read
    by_name = entries_of(d)
    old = {e["name"]: e for e in map(orjson.loads, old_index.splitlines()[1:])}
    assert by_name["a"] == old["a"]
    assert by_name["b"]["row"]["state"] == "suspended"
    # every entry vouched for: the early server answered ps from the rows it read
    read = restart_held(d)
    assert (read["early"], read["listed"], read["opened_first"]) == (True, 2, 0)
    served = d.json("ps", "--all")
    assert {r["boundary"] for r in served} == {"sandbox"}
    before = entries_of(d)
    d.stop()  # neither opened: both entries go back as they were read
    assert entries_of(d) == before
    assert all("boundary" not in e["row"] for e in before.values())


def entries_of(d: Daemon) -> dict[str, Any]:
    """The index's entries by name (a later line wins, as the reader takes them)."""
    return {e["name"]: e for e in map(orjson.loads, index(d).read_bytes().splitlines()[1:])}
