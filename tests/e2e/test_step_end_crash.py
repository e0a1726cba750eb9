"""One commit per step, against kill -9 and a power cut (docs/design.md section 8,
"One commit per step").

A step's end (``sdk.step_done``) is written without waiting for the disk, and the
SDK sends it behind the next step's start. Here the daemon dies (kill -9, at the
``step-end-written`` fault point) once it has written an end and before it made it
durable or answered it; the power-cut simulation then keeps only what the daemon
reported fsynced (``record_synced``), as a machine that lost power would. The step
must come back as started and not finished, judged by the gate's table: an unsafe
step blocks for a person and its work is not done again.

And group commit: four clients sending at once to two sessions until the daemon is
killed; after the same power cut, every send the daemon acknowledged is in its
log at the seq it answered.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

from sessiond.wire import Connection, RemoteError
from tests.e2e.harness import Daemon, short_dir, wait_event
from tests.faults.checks import records

ROOT = Path(__file__).parents[2]

PROGRAM = """from pathlib import Path
from sessiond.sdk import connect

with connect() as run:
    # the default contract: external-write, unsafe, never-rerun
    run.step("pay", lambda: Path("paid.txt").open("a").write("paid\\n") and "paid")
    run.step("next", lambda: None, side_effect="none", idempotency="safe",
             resume="replay-from-event")
    run.complete()
"""

SPEC = """name = "agent"
[run]
kind = "sdk"
exec = ["{python}", "{program}"]
cwd = "."
env = {{ PYTHONPATH = "{root}" }}
retries = 0
[policy]
allow = ["{tool}"]
"""


def power_cut(d: Daemon, synced: Path) -> None:
    """Every log cut back to the last offset the daemon reported fsynced."""
    durable: dict[str, int] = {}
    for line in synced.read_text().splitlines():
        name, at = line.rsplit(" ", 1)
        durable[name] = max(durable.get(name, 0), int(at))
    for name, offset in durable.items():
        os.truncate(d.state_dir / "sessions" / name / "events.jsonl", offset)


def test_a_step_end_never_made_durable_is_a_step_started_and_not_finished() -> None:
    root = short_dir()
    synced = root / "synced.txt"
    try:
        d = Daemon(root, f'fault = "step-end-written"\nrecord_synced = "{synced}"\n')
        d.start()
        program = root / "program.py"
        program.write_text(PROGRAM)
        spec = SPEC.format(python=sys.executable, program=program, root=ROOT, tool="pay")
        d.ctl("create", str(d.write_spec("agent", spec)), check=True)
        d.ctl("activate", "agent", check=True)
        assert d.proc is not None
        assert d.proc.wait(60) == -9  # died with pay's end written, not durable, not answered
        log = d.state_dir / "sessions" / "agent" / "events.jsonl"
        finished = [r["data"]["tool"] for r in records(log, b"tool.finished")]
        assert finished == ["pay"]  # written: a kill -9 alone keeps it (the page cache)
        power_cut(d, synced)
        assert records(log, b"tool.finished") == []
        assert [r["data"]["tool"] for r in records(log, b"tool.started")] == ["pay"]
        assert (root / "paid.txt").read_text() == "paid\n"

        d.config.write_text('log_format = "json"\nstop_grace = "2s"\n')
        d.start()
        blocked = wait_event(
            d, "agent", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert "pay" in blocked["data"]["reason"], blocked
        # judged as a step started and not finished: never run again on its own
        assert (root / "paid.txt").read_text() == "paid\n"
        gate = d.json("log", "agent", "--type", "gate.evaluated")[-1]["data"]
        failed = [c for c in gate["checks"] if not c["ok"]]
        assert [c["name"] for c in failed] == ["tool calls"], gate
        assert d.json("show", "agent")["state"] == "blocked"
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


NOTES = 'name = "{name}"\ngoal = "take notes"\n'


def test_a_kill_during_group_commit_loses_no_acknowledged_event() -> None:
    root = short_dir()
    synced = root / "synced.txt"
    try:
        d = Daemon(root, f'record_synced = "{synced}"\n')
        d.start()
        names = ["n1", "n2"]
        for name in names:
            d.ctl("create", str(d.write_spec(name, NOTES.format(name=name))), check=True)
        acked: list[tuple[str, str, int]] = []  # (session, text, seq) the daemon answered
        ended: list[str] = []  # how each client's sending ended
        lock = threading.Condition()

        def client(n: int) -> None:
            name = names[n % 2]
            try:
                with Connection(d.socket) as conn:
                    for i in range(100_000):
                        text = f"c{n}-{i}"
                        answer: Any = conn.call("send", {"to": name, "text": text})
                        with lock:
                            acked.append((name, text, answer["seq"]))
                            lock.notify_all()
            except RemoteError as exc:
                with lock:
                    ended.append(exc.code)  # the daemon is gone (or a bug: said below)
                    lock.notify_all()

        clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in clients:
            t.start()
        with lock:  # many commits in: then the daemon dies mid-stream
            lock.wait_for(lambda: len(acked) >= 400 or ended, timeout=100)
        d.kill9()
        for t in clients:
            t.join(60)
        assert len(acked) >= 400, ended
        assert set(ended) <= {"closed", "unreachable"}, ended
        power_cut(d, synced)
        kept = {
            name: {
                r["seq"]: r["data"]["text"]
                for r in records(d.state_dir / "sessions" / name / "events.jsonl")
                if r["type"] == "message.received"
            }
            for name in names
        }
        lost = [(name, text, seq) for name, text, seq in acked if kept[name].get(seq) != text]
        assert lost == [], lost[:10]
        d.start()  # and the logs open again as they were cut
        for name in names:
            assert d.json("show", name)["seq"] >= max(s for n, _, s in acked if n == name)
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
