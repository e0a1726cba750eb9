"""A kill -9 during the background load loses nothing, and the daemon serves
meanwhile (docs/design.md, "Start-up").

After a start from the table index, ``daemon.ready`` comes with sessions still
not opened; the background load opens them after. The test-only hold
``fault_hold = "open-midway"`` stops that load once half of them are open, until
a file exists: the daemon is killed there, with some sessions opened by the load,
some by a request, and some never. Nothing waits on time: on the daemon's own log
lines and on its open files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, held_daemon

PLAIN = 'name = "{name}"\n[run]\nexec = ["true"]\ncwd = "."\n'
COUNT = 24  # enough for three groups of each kind below


@pytest.fixture
def midway() -> Iterator[Daemon]:
    """A daemon whose load after the start-up stops halfway until ``go`` exists."""
    with held_daemon("open-midway") as d:
        yield d.start()


def opened(d: Daemon, name: str) -> bool:
    """Whether the daemon holds session ``name``'s log open (an opened session
    does; one not opened yet holds nothing in its folder)."""
    assert d.proc is not None
    folder = f"{d.state_dir}/sessions/{name}/"
    for fd in Path(f"/proc/{d.proc.pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith(folder):
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def test_a_kill_9_during_the_background_load_loses_nothing(midway: Daemon) -> None:
    d = midway
    names = [f"s{n:02d}" for n in range(COUNT)]
    for name in names:
        d.ctl("create", str(d.write_spec(name, PLAIN.format(name=name))), check=True)
    d.ctl("send", "s00", "before the stop", check=True)
    before = d.json("ps", "--all")
    d.stop()  # the index whole: every session vouched for by its entry

    (d.root / "go").unlink()
    since = len(d.lines)
    d.start(wait=False)
    read = d.wait_line("index.read", since=since)
    assert (read["listed"], read["opened_first"]) == (COUNT, 0)
    ready = d.wait_line("daemon.ready", since=since)
    assert ready["unopened"] == COUNT
    d.wait_line("fault.held", match=lambda line: line["point"] == "open-midway", since=since)
    # mid-load: half opened by the load, half not yet
    by_load = [n for n in names if opened(d, n)]
    unopened = [n for n in names if n not in by_load]
    assert len(by_load) == COUNT // 2, by_load
    # ps meanwhile: every session, exactly as before the stop (from the index for
    # the ones not opened, from their logs for the others)
    assert d.json("ps", "--all") == before

    # acknowledged sends during the load: to sessions the load opened, to ones it
    # has not reached (opened by the send), and a session created meanwhile
    acked: dict[str, list[str]] = {"s00": ["before the stop"]}
    for name in [*by_load[:3], *unopened[:3]]:
        for k in range(2):
            text = f"to {name} during the load, {k}"
            d.ctl("send", name, text, check=True)
            acked.setdefault(name, []).append(text)
    d.ctl("create", str(d.write_spec("fresh", PLAIN.format(name="fresh"))), check=True)
    d.ctl("send", "fresh", "to a session created during the load", check=True)
    acked["fresh"] = ["to a session created during the load"]
    never = [n for n in unopened[3:] if n not in acked]
    assert never, "some sessions are still not opened at the kill"
    assert all(opened(d, n) for n in unopened[:3])  # the sends opened them
    assert not any(opened(d, n) for n in never)
    during = d.json("ps", "--all")
    assert {r["name"] for r in during} == {*names, "fresh"}
    assert [r for r in during if r["name"] in never] == [r for r in before if r["name"] in never]
    assert not any(line.get("event") == "daemon.loaded" for line in d.lines[since:])
    d.kill9()  # mid-load: the hold is still on

    (d.root / "go").touch()
    since = len(d.lines)
    d.start()
    read = d.wait_line("index.read", since=since)
    assert read["listed"] + read["opened_first"] == COUNT + 1
    d.wait_line("daemon.loaded", since=since)  # the load completes
    assert d.json("ps", "--all") == during
    for name in [*names, "fresh"]:
        got = d.json("log", name, "--type", "message.received")
        assert [r["data"]["text"] for r in got] == acked.get(name, []), name
    # the index agrees with the logs: a start from the logs alone lists the same
    d.stop()
    (d.state_dir / "table.index").unlink()
    d.start()
    assert d.json("ps", "--all") == during
