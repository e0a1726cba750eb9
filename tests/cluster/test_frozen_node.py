"""A whole node paused (its daemon, spawner, holders and programs SIGSTOPped
together, as a VM pause or a cgroup freeze does) past its lease, its session
taken over and run elsewhere, then resumed: its program writes nothing to a
ledger outside the database after the take-over, and each run carries the
session's epoch to fence such writes (docs/design.md section 10)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sessiond.cluster.lease import LEASE_LOST_EXIT
from tests.cluster.conftest import TTL, taken_over
from tests.e2e.harness import Daemon, wait_event, wait_for
from tests.freeze import freeze, frozen, programs_of, state, thaw

SPEC = """name = "ledger"
[run]
exec = ["python3", "ledger.py"]
cwd = "."
side_effect = "read"
idempotency = "safe"
"""

# The program's ledger outside the database: each line its pid, its run, the
# epoch it was given (environment, wake file) and the machine's monotonic time,
# as often as it can (a write right after any resume).
PROGRAM = """import json, os, time
env = os.environ.get("SESSIOND_EPOCH", "-")
with open(os.environ["SESSIOND_WAKE_FILE"]) as f:
    wake = json.load(f).get("epoch", "-")
head = f"{os.getpid()} {os.environ['SESSIOND_RUN']} {env} {wake}"
with open("ledger", "a", buffering=1) as f:
    while True:
        f.write(f"{head} {time.monotonic()!r}\\n")
        time.sleep(0.005)
"""


def entries(ledger: Path) -> list[tuple[int, str, str, str, float]]:
    out = []
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        pid, run, env, wake, at = line.split()
        out.append((int(pid), run, env, wake, float(at)))
    return out


@pytest.mark.short_lease("n1")
def test_a_frozen_nodes_program_writes_nothing_after_its_session_is_taken_over(
    three: list[Daemon],
) -> None:
    first, *others = three
    (first.root / "ledger.py").write_text(PROGRAM)
    first.ctl("create", str(first.write_spec("ledger", SPEC)), check=True)
    first.ctl("activate", "ledger", check=True)
    run = wait_event(first, "ledger", "run.started")["data"]["run"]
    ledger = first.root / "ledger"
    wait_for(lambda: len(entries(ledger)) >= 3, what="the program writing")

    assert first.proc is not None
    pids = freeze(first.proc.pid)
    try:
        wait_for(lambda: frozen(pids), what="the whole node stopped")
        programs = programs_of(first.proc.pid)
        assert programs
        stopped = time.monotonic()
        new = wait_for(lambda: taken_over(others, "ledger"), timeout=TTL + 30, what="take-over")
        # the session runs on its new node: its program writes to the same ledger
        wait_for(lambda: any(e[1] != run for e in entries(ledger)), what="the new owner's run")
        taken = min(e[4] for e in entries(ledger) if e[1] != run)
        wait_for(lambda: time.monotonic() - stopped >= 5 * TTL, what="5 x lease_ttl")
        thawed = time.monotonic()
        # The worst order a thaw may take: the run's own processes resume first,
        # alone, before its holder, its spawner or its daemon can look at a clock.
        # Either they are dead already, or the program writes at once.
        thaw(programs)
        wait_for(
            lambda: (
                all(state(p) in ("Z", "") for p in programs)
                or any(e[1] == run and e[4] >= thawed for e in entries(ledger))
            ),
            what="the frozen program dead, or writing",
        )
    finally:
        thaw(pids)  # then its holder, spawner and daemon
    assert first.stop(timeout=30) == LEASE_LOST_EXIT  # it woke, found its lease lost, ended

    mine = [e for e in entries(ledger) if e[1] == run]
    assert mine
    # Nothing once its node resumed, nothing once the take-over ran the session.
    assert max(e[4] for e in mine) < thawed
    assert max(e[4] for e in mine) < taken

    # Each run carried its session's epoch (environment and wake file alike), the
    # one its events were written under: the new owner's is higher, so a ledger
    # that keeps the highest epoch per session would refuse the frozen one's.
    records: list[dict[str, Any]] = new.json("log", "ledger")
    started = {r["data"]["run"]: r["epoch"] for r in records if r["type"] == "run.started"}
    epochs = {run: (int(env), int(wake)) for _, run, env, wake, _ in entries(ledger)}
    assert {run: env for run, (env, _) in epochs.items()} == {run: started[run] for run in epochs}
    assert all(env == wake for env, wake in epochs.values())
    later = next(e[1] for e in entries(ledger) if e[1] != run)
    assert started[later] > started[run] >= 1
