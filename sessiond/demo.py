"""``python -m sessiond.demo``: the event log at work, offline, in a few seconds.

Writes a session's log the way a run records itself, tears its last write as a
crash would, reopens it (repair, snapshot + tail replay), and prints the state
and its projections; then forks, exports, imports and checks the state dir.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from pathlib import Path

import orjson

from sessiond.log.bundle import export_session, import_session
from sessiond.log.event_data import (
    LifecycleChanged,
    MessageReceived,
    ModelRequested,
    ModelResponded,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    RunFinished,
    RunStarted,
    SessionCreated,
    ToolFinished,
    ToolIntent,
    ToolStarted,
    VerificationFinished,
    VerificationStarted,
    WakeRequested,
)
from sessiond.log.fsck import check
from sessiond.log.journal import Journal
from sessiond.log.lineage import fork
from sessiond.log.projections import messages, trace
from sessiond.log.store.base import Draft
from sessiond.log.store.files import FileStore
from sessiond.logs import configure

SPEC = """name = "payroll"
goal = "Compute payroll/2026-11.csv from employees.csv and rates.csv"
agent = "finance"
"""


def _title(text: str) -> None:
    print(f"\n== {text} ==")


async def write_session(store: FileStore) -> None:
    created = await store.create("payroll", spec=SPEC)
    await created.close()
    journal = await Journal.open(store, "payroll", snapshot_every=8)
    artifacts = store.artifacts("payroll")
    await journal.append(
        SessionCreated(
            name="payroll",
            goal="Compute payroll/2026-11.csv from employees.csv and rates.csv",
            agent="finance",
            priority=50,
        )
    )
    await journal.append(LifecycleChanged(from_state="created", to="sleeping", reason="armed"))
    wake = await journal.append(WakeRequested(trigger="cron", details={"schedule": "0 9 1 * *"}))
    await journal.append(LifecycleChanged(from_state="sleeping", to="running", reason="cron"))
    await journal.append(RunStarted(run="r1", pid=4242, pgid=4242), causation=wake["id"])

    context = artifacts.put(b'[{"role":"user","content":"compute payroll"}]', "context.json")
    await journal.append(
        ModelRequested(model="scripted-1", request_id="q1", context=context, tool_count=2)
    )
    await journal.append(
        ModelResponded(
            model="scripted-1",
            request_id="q1",
            tokens_in=812,
            tokens_out=64,
            duration_ms=420,
            text="I will run the payroll script.",
        )
    )
    call = "c1"
    output = artifacts.put(b"employees: 3\ntotal: 14250.00\n", "stdout", "text/plain")
    await journal.append_many(
        [
            Draft(
                ToolIntent(
                    call=call,
                    tool="compute_payroll",
                    args={"month": "2026-11"},
                    risk=RiskContract(side_effect="workspace-write", idempotency="safe"),
                    writes=("payroll/2026-11.csv",),
                ),
                correlation=call,
            ),
            Draft(
                PolicyDecided(
                    call=call, tool="compute_payroll", decision="allow", rule="default: write"
                ),
                correlation=call,
            ),
            Draft(
                ToolStarted(
                    call=call, tool="compute_payroll", hashes={"payroll/2026-11.csv": None}
                ),
                correlation=call,
            ),
        ]
    )
    await journal.append(
        ToolFinished(
            call=call,
            tool="compute_payroll",
            status="ok",
            exit_code=0,
            hashes={"payroll/2026-11.csv": "9" * 64},
            output=output,
            duration_ms=35,
        ),
        correlation=call,
    )
    await journal.append(
        ObservationProjected(call=call, tool="compute_payroll", text="3 employees, 14250.00"),
        correlation=call,
    )
    await journal.append(VerificationStarted(check="totals match the ledger"))
    await journal.append(VerificationFinished(check="totals match the ledger", ok=True))
    await journal.append(MessageReceived(sender="auditor", text="Please keep the rates table."))
    await journal.append(RunFinished(run="r1", status="ok", exit_code=0, duration_ms=1200))
    await journal.append(LifecycleChanged(from_state="running", to="sleeping", reason="done"))
    await journal.close()


async def demo(state_dir: Path) -> None:
    store = FileStore(state_dir)
    print(f"state dir: {state_dir}")
    await write_session(store)
    log_path = store.log_path("payroll")
    print(f"wrote {sum(1 for _ in store.read('payroll'))} events to {log_path}")

    _title("a crash tears the last write")
    with open(log_path, "ab") as f:
        f.write(b'{"v":1,"session":"payroll","seq":19,"ty')
    print("appended half a line, as a kill -9 in the middle of a write would leave it")

    _title("reopen: repair, then snapshot + tail replay (runs nothing)")
    journal = await Journal.open(store, "payroll", snapshot_every=8)
    s = journal.state
    print(f"replayed from the snapshot at seq {journal.from_snapshot}, now at seq {s.seq}")
    print(f"repairs: {s.repairs[-1]['reason']}, {s.repairs[-1]['dropped_bytes']} bytes dropped")

    _title("state")
    summary = {
        "name": s.name,
        "state": s.state,
        "reason": s.reason,
        "runs": s.runs,
        "model_replies": s.model_replies,
        "tokens": s.tokens_in + s.tokens_out,
        "tool_calls": s.tool_calls,
        "open_calls": len(s.calls),
        "last_observation": s.last_observation and s.last_observation["text"],
        "file_hashes": {k: (v or "")[:12] for k, v in s.file_hashes.items()},
        "unread_messages": len(s.mailbox),
        "stable_point": s.at_stable_point(),
    }
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())

    _title("messages view (what a model would see)")
    for m in messages(list(store.read("payroll"))):
        print(f"{m['role']:>9}: {m['content']}")

    _title("trace")
    print("\n".join(trace(store.read("payroll"))))

    _title("fork, export, import")
    child = await fork(store, journal, "payroll-what-if", at_seq=9)
    print(f"forked payroll at seq 9 as {child.session}: its log starts with the same 9 events")
    await child.close()
    bundle = state_dir / "payroll.bundle"
    manifest = export_session(store, "payroll", bundle)
    print(f"exported {manifest['events']['count']} events to {bundle}")
    copy = await import_session(store, bundle, name="payroll-copy")
    print(f"imported as {copy.session} at seq {copy.state.seq} (session.imported appended)")
    await copy.close()
    await journal.close()

    _title("sessiond fsck")
    report = check(state_dir)
    print(f"{report.sessions} sessions, {report.events} events, problems: {len(report.problems)}")
    for problem in report.problems:
        print(problem.line())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessiond.demo", description=__doc__)
    parser.add_argument(
        "--state-dir", type=Path, default=Path(".demo-state"), help="(emptied first)"
    )
    args = parser.parse_args(argv)
    # The tour says in its own words what the log does (a commit, a repair); the
    # store's log lines would repeat it as noise. Only an error is worth a line.
    configure(level="error")
    shutil.rmtree(args.state_dir, ignore_errors=True)
    asyncio.run(demo(args.state_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
