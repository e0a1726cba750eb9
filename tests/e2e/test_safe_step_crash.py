"""A step whose rerun is harmless is started without waiting for the disk
(docs/design.md section 8, "A step that touches nothing"), against kill -9 and a
power cut.

The daemon dies at the ``step-run-answered`` fault point: once it has sent an
``sdk.step`` its answer ``run``, before its loop does anything else (a deferred
flush included). The power-cut simulation then keeps only what the daemon reported
fsynced (``record_synced``), as a machine that lost power would. A read-only
``safe`` step's start is gone, so the next run takes the step again, with no gate
block; a step of the default contract has its start on record, so the gate blocks
it and its work is not done again. And a safe step with nothing after it becomes
durable by itself (``END_WITHIN``): its finish, once durable, is replayed, never
run again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from sessiond.runs.leftovers import marked
from sessiond.wire import Connection, RemoteError
from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for
from tests.e2e.test_step_end_crash import SPEC, power_cut
from tests.faults import faultfs
from tests.faults.checks import holders, records

ROOT = Path(__file__).parents[2]

SAFE = 'side_effect="read", idempotency="safe", resume="replay-from-event"'

PROGRAM = """import json, os

from sessiond.sdk import connect


def look():
    with open("looked.txt", "a") as f:
        f.write("looked\\n")
    return "seen"


with open("runs.txt", "a") as f:  # what a program that outlived its daemon holds
    f.write(json.dumps([os.environ["SESSIOND_SOCKET"], os.environ["SESSIOND_TOKEN"]]) + "\\n")
with connect() as run:
    run.step("look", look{contract})
    run.complete()
"""


def looked(root: Path) -> int:
    path = root / "looked.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def looked_before_it_died(root: Path) -> int:
    """How often the step's work was done once the daemon died: its spawner kills
    the run's program as it goes, and the program may or may not have done the
    work by then (it had its answer), so the count is read once it is gone."""
    program = str(root / "program.py")
    wait_for(lambda: not program_alive(program), what="the run's program gone with its daemon")
    return looked(root)


def program_alive(program: str) -> bool:
    needle = program.encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    return True
    return False


def tools(log: Path, etype: bytes) -> list[str]:
    return [r["data"]["tool"] for r in records(log, etype)]


def start_agent(d: Daemon, root: Path, program: str) -> None:
    path = root / "program.py"
    path.write_text(program)
    spec = SPEC.format(python=sys.executable, program=path, root=ROOT, tool="look")
    d.ctl("create", str(d.write_spec("agent", spec)), check=True)
    d.ctl("activate", "agent", check=True)


@pytest.mark.parametrize("safe", [True, False], ids=["read-only-safe", "default-contract"])
def test_a_power_cut_right_after_run_is_answered(safe: bool) -> None:
    root = short_dir()
    synced = root / "synced.txt"
    try:
        d = Daemon(root, f'fault = "step-run-answered"\nrecord_synced = "{synced}"\n')
        d.start()
        start_agent(d, root, PROGRAM.format(contract=f", {SAFE}" if safe else ""))
        assert d.proc is not None
        assert d.proc.wait(60) == -9  # died right after answering the step `run`
        before = looked_before_it_died(root)  # 1 if the program did it in time
        log = d.state_dir / "sessions" / "agent" / "events.jsonl"
        assert tools(log, b"tool.started") == ["look"]  # written: kill -9 keeps it
        power_cut(d, synced)
        d.config.write_text('log_format = "json"\nstop_grace = "2s"\n')
        if safe:
            # answered before it was durable: the power cut took the start
            assert tools(log, b"tool.started") == []
            d.start()
            # the step looks never started: the next run takes it again, unblocked
            wait_event(d, "agent", "run.finished", match=lambda r: r["data"]["status"] == "ok")
            assert looked(root) == before + 1
            assert tools(log, b"tool.started") == ["look"]
            assert tools(log, b"tool.finished") == ["look"]
            gates = d.json("log", "agent", "--type", "gate.evaluated")
            assert {g["data"]["outcome"] for g in gates} == {"ok"}, gates
            changes = d.json("log", "agent", "--type", "lifecycle.changed")
            assert "blocked" not in [c["data"]["to"] for c in changes]
            # the lost start's call id is never given to another step (a run's id is
            # on record before its program runs), and the first run's program, had
            # it outlived its daemon, could not end anything: its token died with it
            assert [r["data"]["call"] for r in records(log, b"tool.started")] == ["r2.1"]
            socket, token = json.loads((root / "runs.txt").read_text().splitlines()[0])
            with Connection(Path(socket)) as conn, pytest.raises(RemoteError) as refused:
                conn.call("sdk.step_done", {"token": token, "call": "r1.1", "result": "forged"})
            assert refused.value.code == "token_refused", refused.value
            assert tools(log, b"tool.finished") == ["look"]
        else:
            # durable before its answer: the power cut kept it, and the gate judges it
            assert tools(log, b"tool.started") == ["look"]
            d.start()
            blocked = wait_event(
                d, "agent", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
            )
            assert "look" in blocked["data"]["reason"], blocked
            gate = d.json("log", "agent", "--type", "gate.evaluated")[-1]["data"]
            assert [c["name"] for c in gate["checks"] if not c["ok"]] == ["tool calls"], gate
            assert looked(root) == before  # never run again on its own
            assert tools(log, b"tool.finished") == []
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


WAITING = """from sessiond.sdk import connect


def look():
    with open("looked.txt", "a") as f:
        f.write("looked\\n")
    with open("go1.fifo") as f:  # blocks until the test lets it go: nothing is asked
        f.read()
    return "seen"


with connect() as run:
    run.step("look", look, {safe})
    with open("go2.fifo") as f:  # the step's end sent; nothing else asked meanwhile
        f.read()
    run.complete()
"""


def line_end(log: Path, etype: bytes, tool: str) -> int:
    """The offset just past the line of ``tool``'s ``etype`` record (0: none yet)."""
    data = log.read_bytes() if log.exists() else b""
    at = 0
    for line in data.splitlines(keepends=True):
        at += len(line)
        if b'"type":"' + etype + b'"' in line and f'"tool":"{tool}"'.encode() in line:
            return at
    return 0


def synced_to(synced: Path, session: str) -> int:
    """How far the daemon reported the session's log fsynced."""
    lines = synced.read_text().splitlines() if synced.exists() else []
    pairs = [line.rsplit(" ", 1) for line in lines]
    return max((int(at) for name, at in pairs if name == session), default=0)


def let_go(fifo: Path) -> None:
    with open(fifo, "w") as f:  # opens once the program reads it: no race
        f.write("go\n")


def test_a_safe_start_with_nothing_after_it_becomes_durable_and_its_end_is_replayed() -> None:
    root = short_dir()
    synced = root / "synced.txt"
    try:
        for fifo in ("go1.fifo", "go2.fifo"):
            os.mkfifo(root / fifo)
            os.chmod(root / fifo, 0o666)
        d = Daemon(root, f'record_synced = "{synced}"\n')
        d.start()
        start_agent(d, root, WAITING.format(safe=SAFE))
        log = d.state_dir / "sessions" / "agent" / "events.jsonl"
        wait_for(lambda: looked(root) == 1, what="the step's work")
        # its fn waits and the program asks nothing: the start is made durable by
        # the daemon's own deferred flush, or never
        started = wait_for(lambda: line_end(log, b"tool.started", "look"), what="the start")
        wait_for(lambda: synced_to(synced, "agent") >= started, what="the start fsynced")
        let_go(root / "go1.fifo")
        ended = wait_for(
            lambda: line_end(log, b"observation.projected", "look"), what="the step's end"
        )
        wait_for(lambda: synced_to(synced, "agent") >= ended, what="the end fsynced")
        d.kill9()
        power_cut(d, synced)
        assert tools(log, b"tool.finished") == ["look"]  # durable: the cut kept it
        d.start()
        # the next run's program (the first one was stopped before it started), past
        # the replayed step
        wait_event(d, "agent", "run.started", match=lambda r: r["data"]["run"] != "r1")
        let_go(root / "go2.fifo")
        wait_event(d, "agent", "run.finished", match=lambda r: r["data"]["status"] == "ok")
        assert looked(root) == 1  # replayed from its durable end, never run again
        assert tools(log, b"tool.finished") == ["look"]
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(
    faultfs.usable() is not None, reason=f"no fault file system: {faultfs.usable()}"
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_on_the_fault_file_system_a_cut_after_a_safe_run_ends_as_the_gate_would(seed: int) -> None:
    """The same cut where the daemon's word is not trusted: the state dir on the
    fault file system, which at a power cut keeps what was fsynced and a random
    prefix of the rest (tests/faults/faultmodel.py). The start is lost or kept,
    as the disk had it; either way the step runs again, once, with no block.
    (Here seed 1 lost it and seeds 2 and 3 kept it, when this was written.)"""
    root = short_dir()
    try:
        with faultfs.mounted(root / "fs") as mount:
            d = Daemon(root, 'fault = "step-run-answered"\n')
            d.state_dir = mount.path / "state"
            # the run's uid writes the workspace (root) by its mode, as the daemon
            # asks where it cannot give it an ACL (the state dir is on the mount)
            os.chmod(root, 0o1777)
            d.start()
            start_agent(d, root, PROGRAM.format(contract=f", {SAFE}"))
            assert d.proc is not None
            assert d.proc.wait(60) == -9
            before = looked_before_it_died(root)
            for pid in marked(d.state_dir):  # the power stops every process of it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not holders(mount.path), what="nothing open on the mount")
            mount.cut(seed)
            log = d.state_dir / "sessions" / "agent" / "events.jsonl"
            kept = tools(log, b"tool.started")
            d.config.write_text('log_format = "json"\nstop_grace = "2s"\n')
            d.start()
            wait_event(d, "agent", "run.finished", match=lambda r: r["data"]["status"] == "ok")
            assert looked(root) == before + 1  # run again, whether the cut kept its start or not
            finished = [r["data"] for r in records(log, b"tool.finished")]
            assert [f["status"] for f in finished if f["status"] == "ok"] == ["ok"]
            # kept: closed as interrupted by the gate first; lost: nothing to close
            assert len(finished) == (2 if kept else 1), (kept, finished)
            changes = d.json("log", "agent", "--type", "lifecycle.changed")
            assert "blocked" not in [c["data"]["to"] for c in changes]
            d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
