"""Write a golden log of the *current* schema version: one event of every type.

Run it once when a version is published (``python -m tests.golden.write_current``)
and commit the result under ``tests/golden/v<N>/``; when event types or optional
fields are added within a version, write a folder of its own beside it
(``v1-spec-applied``: ``spec.applied``, and who answered; ``v1-gc-collected``:
``gc.collected``; ``v1-migration``: the hand-over's ``migration.*`` events).
Never regenerate a published
version: the point of these files is that logs written by every earlier version
stay readable (``tests/log/test_golden.py`` replays them all).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import orjson

from sessiond.log.event_data import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    ArtifactRef,
    BindingObserved,
    BudgetExhausted,
    CollectedArtifact,
    ContextCompacted,
    EventData,
    GateCheck,
    GateEvaluated,
    GcCollected,
    LifecycleChanged,
    LogRepaired,
    MessageReceived,
    MigrationAborted,
    MigrationArriving,
    MigrationDiscarded,
    MigrationFinished,
    MigrationStarted,
    ModelRequested,
    ModelResponded,
    ObservationProjected,
    PolicyDecided,
    RecoveryResolved,
    RiskContract,
    RunFinished,
    RunStarted,
    SessionCreated,
    SessionForked,
    SessionImported,
    SessionMerged,
    SessionMigrated,
    SpecApplied,
    ToolFinished,
    ToolIntent,
    ToolStarted,
    VerificationFinished,
    VerificationStarted,
    WakeRequested,
)
from sessiond.log.events import CURRENT_VERSION
from sessiond.log.replay import replay_all
from sessiond.log.store.base import Draft
from sessiond.log.store.files import FileStore

REF = ArtifactRef(ref="sha256:" + "a" * 64, name="stdout", size=12, media_type="text/plain")
CTX = ArtifactRef(ref="sha256:" + "b" * 64, name="context.json", size=40)
H = "c" * 64


def every_type() -> list[Draft]:
    payloads: list[EventData] = [
        SessionCreated(
            name="golden",
            goal="exercise every event type",
            description="golden log",
            agent="tester",
            priority=5,
            labels={"team": "core"},
            spec={"name": "golden", "run": {"kind": "sdk"}},
            spec_sha256=H,
        ),
        LifecycleChanged(from_state="created", to="sleeping", reason="armed"),
        BindingObserved(hashes={"rates.csv": H, "gone.csv": None}),
        WakeRequested(trigger="cron", details={"schedule": "0 9 1 * *", "fire": "2026-12-01"}),
        GateEvaluated(ok=True, checks=(GateCheck(name="log intact", ok=True),)),
        LifecycleChanged(from_state="sleeping", to="running", reason="cron"),
        RunStarted(run="r1", kind="sdk", pid=100, pgid=100, proc_start=5, wakes=({"t": 1},)),
        ModelRequested(model="m-1", request_id="q1", context=CTX, tools_sha256=H, tool_count=3),
        ModelResponded(
            model="m-1",
            request_id="q1",
            tokens_in=10,
            tokens_out=5,
            duration_ms=7,
            text="let me edit",
            response=REF,
        ),
        ToolIntent(
            call="c1",
            tool="edit_file",
            args={"path": "a.py"},
            risk=RiskContract(
                side_effect="workspace-write", idempotency="unsafe", resume="never-rerun"
            ),
            writes=("a.py",),
        ),
        PolicyDecided(call="c1", tool="edit_file", decision="ask", rule="ask: edit_file"),
        ApprovalRequested(call="c1", tool="edit_file", args_sha256=H),
        ApprovalGranted(
            call="c1", tool="edit_file", args_sha256=H, by="ann", expires_at="2030-01-01T00:00:00Z"
        ),
        ToolStarted(call="c1", tool="edit_file", hashes={"a.py": H}, git_head="d" * 40),
        ToolFinished(
            call="c1",
            tool="edit_file",
            status="ok",
            exit_code=0,
            hashes={"a.py": "e" * 64},
            output=REF,
            diff=REF,
            truncated=True,
            limit=1024,
            duration_ms=3,
        ),
        ObservationProjected(call="c1", tool="edit_file", text="edited a.py"),
        ToolIntent(call="c2", tool="send_email", risk=RiskContract(side_effect="external-write")),
        PolicyDecided(call="c2", tool="send_email", decision="ask", rule="default: external"),
        ApprovalRequested(call="c2", tool="send_email"),
        ApprovalDenied(call="c2", tool="send_email", by="ann", reason="not today"),
        ObservationProjected(call="c2", tool="send_email", text="denied", source="denied"),
        VerificationStarted(check="pytest -q"),
        VerificationFinished(check="pytest -q", ok=True, output=REF, duration_ms=900),
        MessageReceived(sender="other", text="hello", role="agent", message_id="m1"),
        SessionForked(parent="golden", child="golden-side", at_seq=20),
        SessionMerged(
            child="golden-side", summary="side quest done", artifacts=(REF,), child_seq=4
        ),
        ContextCompacted(from_seq=8, to_seq=16, summary="edited a.py after approval"),
        BudgetExhausted(budget="tokens", limit=10, used=15),
        RunFinished(run="r1", status="ok", exit_code=0, duration_ms=4000, stdout=REF, stderr=REF),
        RecoveryResolved(
            option="accept",
            hashes={"rates.csv": "f" * 64},
            by="ann",
            uid=1000,
            user="ann",
            channel="cli",
        ),
        SpecApplied(
            spec_sha256=H, artifact=REF, changed=("policy",), by="tighter", uid=0, user="root"
        ),
        SessionMigrated(from_profile="default", to_profile="big-model"),
        SessionImported(original_name="golden", bundle_sha256=H, events=30),
        MigrationStarted(handover="1" * 32, to="/run/other/sessiond.sock"),
        MigrationAborted(handover="1" * 32, to="/run/other/sessiond.sock", reason="refused"),
        MigrationArriving(handover="2" * 32, source="/run/first.sock", restore="sleeping"),
        MigrationFinished(handover="2" * 32, by="operator", uid=0, user="root", channel="cli"),
        MigrationDiscarded(handover="3" * 32, reason="the source aborted the hand-over"),
        LogRepaired(dropped_bytes=12, at_offset=3000, last_good_seq=32, reason="torn write"),
        GcCollected(
            artifacts=(
                CollectedArtifact(artifact="sha256:" + "9" * 64, size=40, rule="terminated"),
            ),
            snapshots=(10,),
            bytes=4096,
            uid=1000,
            user="ann",
        ),
        LifecycleChanged(from_state="running", to="terminated", outcome="completed", reason="done"),
    ]
    assert {p.EVENT_TYPE for p in payloads} == set(CURRENT_VERSION)
    return [Draft(p, correlation=getattr(p, "call", None)) for p in payloads]


async def write(target: Path) -> None:
    clock = iter(range(1_780_000_000_000_000_000, 1_790_000_000_000_000_000, 1_000_000_007))
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(Path(tmp), clock=lambda: next(clock))
        log = await store.create("golden")
        for draft in every_type():
            await log.append_many([draft])
        await log.close()
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(store.log_path("golden"), target / "golden.jsonl")
        state = replay_all("golden", store.read("golden"))
        (target / "golden.state.json").write_bytes(
            orjson.dumps(state, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        )


if __name__ == "__main__":
    # A folder of its own when types or fields were added at the same version
    # (``python -m tests.golden.write_current v1-spec-applied``): a published
    # golden log is never written again.
    import sys

    version = max(CURRENT_VERSION.values())
    folder = sys.argv[1] if len(sys.argv) > 1 else f"v{version}"
    asyncio.run(write(Path(__file__).parent / folder))
