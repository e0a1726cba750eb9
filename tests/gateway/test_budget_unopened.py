"""An agent's daily budget right after a start-up, with its sessions not opened
yet: counted from their index entries (checked against their logs like the rest
of the entry), so a model call waits for none of them; a session whose entry
cannot say what it spent is opened first (fail closed). The test-only hold
``fault_hold = "open-late"`` keeps the background load from opening anything
after ``daemon.ready`` until a file exists: nothing waits on time."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from sessiond.gateway.scripted import Reply, text
from tests.e2e.harness import Daemon, wait_event
from tests.e2e.test_load_crash import opened
from tests.gateway.rig import CLIENT, gateway
from tests.gateway.test_budget_e2e import SPEC, call_past_the_agents_budget, start

AGENT = "\n[agents.scribe.budget]\ncost_usd_per_day = 0.0004\n"


@contextmanager
def held_gateway() -> Iterator[tuple[Daemon, Path]]:
    """A gateway daemon with three sessions, stopped; started again with its load
    after the start-up held (``go``: the file that lets it go on)."""
    hold = Path(tempfile.mkdtemp(prefix="sd-go-"))
    go = hold / "go"
    replies = [Reply.of(text(f"r{i}"), input_tokens=40, output_tokens=10) for i in range(4)]
    try:
        with gateway(replies, AGENT) as (d, _up):
            # 40 in and 10 out at $3 and $15 a million: $0.00027 a call
            start(d, "first", "", 1, agent="scribe")
            wait_event(d, "first", "run.finished")
            for name, agent in (("idle", "scribe"), ("other", "")):
                spec = SPEC.format(name=name, agent=agent, python=sys.executable, client=CLIENT,
                                   cwd=d.root, budget="")  # fmt: skip
                d.ctl("create", str(d.write_spec(name, spec)), check=True)
            d.stop()
            held = f'fault_hold = "open-late"\nfault_hold_until = "{go}"\n'
            d.config.write_text(held + d.config.read_text())  # (keys before the tables)
            yield d, go
    finally:
        shutil.rmtree(hold, ignore_errors=True)


def loading(d: Daemon, since: int) -> bool:
    return not any(line.get("event") == "daemon.loaded" for line in d.lines[since:])


def test_an_agents_budget_counts_unopened_sessions_from_their_entries() -> None:
    # Behaviour change: before, the call waited for every session to be opened.
    with held_gateway() as (d, go):
        since = len(d.lines)
        d.start()
        ready = d.wait_line("daemon.ready", since=since)
        assert ready["unopened"] == 3
        call_past_the_agents_budget(d)
        assert not any(opened(d, n) for n in ("first", "idle", "other"))
        assert loading(d, since)
        go.touch()
        d.wait_line("daemon.loaded", since=since)


def test_an_entry_that_cannot_say_what_was_spent_opens_its_session_first() -> None:
    # An index written before entries had ``spend`` (or with one that is not a
    # spend): those of the agent's sessions are opened for the call, the others not.
    with held_gateway() as (d, go):
        path = d.state_dir / "table.index"
        header, *lines = path.read_bytes().splitlines()
        entries = [orjson.loads(line) for line in lines]
        for entry in entries:
            if entry["name"] == "first":
                del entry["spend"]
            else:
                entry["spend"] = {"2026-01-01": ["a lot", 1]}
        path.write_bytes(b"\n".join([header, *map(orjson.dumps, entries)]) + b"\n")
        since = len(d.lines)
        d.start()
        assert d.wait_line("daemon.ready", since=since)["unopened"] == 3
        call_past_the_agents_budget(d)
        assert opened(d, "first")
        assert opened(d, "idle")
        assert not opened(d, "other")  # not the agent's: not needed
        assert loading(d, since)
        go.touch()
        d.wait_line("daemon.loaded", since=since)
