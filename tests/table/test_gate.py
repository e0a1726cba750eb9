"""The resume gate's decision table: every tool state x risk contract x file state."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest

from sessiond.log.event_data import (
    ApprovalGranted,
    ApprovalRequested,
    ArtifactRef,
    BindingObserved,
    EventData,
    PolicyDecided,
    RiskContract,
    ToolFinished,
    ToolIntent,
    ToolStarted,
)
from sessiond.log.event_records import RiskJson
from sessiond.log.replay import replay_all
from sessiond.log.store.base import Draft, Record
from sessiond.log.store.memory import MemoryStore
from sessiond.table import recovery
from sessiond.table.gate import (
    CLOSE_INTERRUPTED,
    DROP_UNSTARTED,
    KEEP_APPROVED,
    REBUILD_OBSERVATION,
    evaluate,
    rerun_harmless,
    rerun_refusal,
)
from sessiond.table.policy_rules import decide
from sessiond.table.spec import parse_spec
from tests.helpers import arun

H_BEFORE, H_AFTER, H_BOUND, H_OTHER = "1" * 64, "2" * 64, "3" * 64, "4" * 64
NOW = "2026-06-01T12:00:00Z"

STAGES = ["intent", "decided", "approval", "approved", "started", "finished"]
RISKS = [
    RiskContract(idempotency=i, resume=r)
    for i, r in itertools.product(
        ["safe", "conditional", "unsafe"],
        ["replay-from-event", "rerun-after-check", "require-user-confirmation", "never-rerun"],
    )
]
FILES = ["unchanged", "written-path-changed", "bound-file-changed", "bound-change-is-the-cause"]


def _events(stage: str, risk: RiskContract) -> list[EventData]:
    events: list[EventData] = [
        BindingObserved(hashes={"bound.txt": H_BOUND}),
        ToolIntent(call="c1", tool="edit_file", risk=risk, writes=("out.txt",)),
    ]
    if stage == "intent":
        return events
    if stage in ("approval", "approved"):
        events.append(
            PolicyDecided(call="c1", tool="edit_file", decision="ask", rule="ask: edit_file")
        )
        events.append(ApprovalRequested(call="c1", tool="edit_file"))
        if stage == "approved":
            events.append(
                ApprovalGranted(call="c1", tool="edit_file", expires_at="2026-06-01T13:00:00Z")
            )
        return events
    events.append(
        PolicyDecided(call="c1", tool="edit_file", decision="allow", rule="allow: edit_file")
    )
    if stage == "decided":
        return events
    events.append(ToolStarted(call="c1", tool="edit_file", hashes={"out.txt": H_BEFORE}))
    if stage == "finished":
        events.append(
            ToolFinished(
                call="c1", tool="edit_file", status="ok", exit_code=0, hashes={"out.txt": H_AFTER}
            )
        )
    return events


def _state(events: list[EventData]) -> Any:
    async def go() -> list[Record]:
        log = await MemoryStore().create("s")
        return await log.append_many([Draft(e) for e in events])

    return replay_all("s", arun(go()))


SPEC = parse_spec(
    'name = "s"\n[policy]\nallow = ["edit_file"]\n', base=__import__("pathlib").Path("/")
)


def expected(stage: str, risk: RiskContract, files: str) -> tuple[str, str | None]:
    """docs/design.md section 5, written out: (outcome, action for c1)."""
    bound_bad = files == "bound-file-changed"
    if stage == "intent":
        return ("blocked" if bound_bad else "ok"), DROP_UNSTARTED
    if stage == "decided":
        return ("blocked" if bound_bad else "ok"), DROP_UNSTARTED
    if stage == "approval":
        return "blocked", None
    if stage == "approved":
        return ("blocked" if bound_bad else "ok"), KEEP_APPROVED
    if stage == "started":
        unsafe = risk.idempotency == "unsafe" or risk.resume in (
            "require-user-confirmation", "never-rerun"
        )  # fmt: skip
        if unsafe or files == "written-path-changed":
            return "blocked", None
        return ("blocked" if bound_bad else "ok"), CLOSE_INTERRUPTED
    # finished: the written path now has its after-hash (recorded by tool.finished)
    return (
        "blocked" if bound_bad or files == "written-path-changed" else "ok"
    ), REBUILD_OBSERVATION


@pytest.mark.parametrize(
    ("stage", "risk", "files"),
    list(itertools.product(STAGES, RISKS, FILES)),
    ids=lambda v: v if isinstance(v, str) else f"{v.idempotency}/{v.resume}",
)
def test_the_gate_follows_the_design_table(stage: str, risk: RiskContract, files: str) -> None:
    state = _state(_events(stage, risk))
    written = {"before": H_BEFORE, "after": H_AFTER}["after" if stage == "finished" else "before"]
    disk = {"out.txt": written, "bound.txt": H_BOUND}
    if files == "written-path-changed":
        disk["out.txt"] = H_OTHER
    if files in ("bound-file-changed", "bound-change-is-the-cause"):
        disk["bound.txt"] = H_OTHER
    cause = frozenset({"bound.txt"}) if files == "bound-change-is-the-cause" else frozenset()
    verdict = evaluate(
        state, SPEC, now=NOW, hash_file=disk.get, has_artifact=lambda ref: True, cause_paths=cause
    )
    outcome, action = expected(stage, risk, files)
    assert verdict.outcome == outcome, verdict.failing()
    if action is not None:
        assert verdict.actions.get("c1") == action
    if outcome == "blocked":
        # only the options that change something (sessiond.table.recovery)
        kinds = {c.kind for c in verdict.causes}
        want = {o for k in kinds for o in recovery.KINDS[k][0]}
        assert set(verdict.options) == want, kinds
        assert verdict.failing()


def test_an_expired_approval_blocks() -> None:
    state = _state(_events("approved", RiskContract()))
    disk = {"out.txt": H_BEFORE, "bound.txt": H_BOUND}
    later = "2026-06-01T13:00:01Z"
    verdict = evaluate(state, SPEC, now=later, hash_file=disk.get, has_artifact=lambda r: True)
    assert verdict.outcome == "blocked"
    assert "expired" in verdict.failing()


def test_a_policy_that_now_denies_revokes_the_approval() -> None:
    state = _state(_events("approved", RiskContract()))
    strict = parse_spec(
        'name = "s"\n[policy]\ndeny = ["edit_*"]\n', base=__import__("pathlib").Path("/")
    )
    disk = {"out.txt": H_BEFORE, "bound.txt": H_BOUND}
    verdict = evaluate(state, strict, now=NOW, hash_file=disk.get, has_artifact=lambda r: True)
    assert verdict.outcome == "blocked"
    assert "denied by the policy in force now" in verdict.failing()


def test_a_spent_budget_suspends_instead_of_blocking() -> None:
    spec = parse_spec('name = "s"\n[budget]\ntokens = 10\n', base=__import__("pathlib").Path("/"))
    state = _state([])
    state.tokens_in = 11
    verdict = evaluate(state, spec, now=NOW, hash_file=lambda p: None, has_artifact=lambda r: True)
    assert verdict.outcome == "suspended"
    assert "tokens: 11 of 10" in verdict.failing()


def test_a_corrupt_log_blocks_with_its_reason() -> None:
    verdict = evaluate(
        _state([]),
        SPEC,
        now=NOW,
        hash_file=lambda p: None,
        has_artifact=lambda r: True,
        log_error="line 7 is corrupt",
    )
    assert verdict.outcome == "blocked"
    assert verdict.failing() == "log intact: line 7 is corrupt"


@pytest.mark.parametrize(
    ("deny", "ask", "allow", "tool", "side_effect", "decision", "rule"),
    [
        ([], [], [], "read_file", "read", "allow", "default: read allowed"),
        ([], [], [], "send_email", "external-write", "ask", "default: external-write asks"),
        ([], [], ["send_*"], "send_email", "external-write", "allow", "allow: send_*"),
        (["send_*"], [], ["send_email"], "send_email", "external-write", "deny", "deny: send_*"),
        ([], ["edit_*"], ["edit_file"], "edit_file", "workspace-write", "ask", "ask: edit_*"),
    ],
)
def test_policy_deny_then_ask_then_allow_then_defaults(
    deny: list[str],
    ask: list[str],
    allow: list[str],
    tool: str,
    side_effect: str,
    decision: str,
    rule: str,
) -> None:
    from sessiond.table.spec import PolicySpec

    verdict = decide(PolicySpec(deny=deny, ask=ask, allow=allow), tool, side_effect)
    assert (verdict.decision, verdict.rule) == (decision, rule)


def test_an_artifact_that_lost_its_hash_blocks_naming_it_and_what_was_found() -> None:
    output = ArtifactRef(ref="sha256:" + "a" * 64, name="stdout", size=5)
    state = _state(
        [
            ToolIntent(call="c1", tool="edit_file", risk=RiskContract(), writes=("out.txt",)),
            PolicyDecided(call="c1", tool="edit_file", decision="allow", rule="allow: edit_file"),
            ToolStarted(call="c1", tool="edit_file", hashes={"out.txt": H_BEFORE}),
            ToolFinished(
                call="c1",
                tool="edit_file",
                status="ok",
                exit_code=0,
                hashes={"out.txt": H_AFTER},
                output=output,
            ),
        ]
    )
    asked: list[str] = []

    def check_artifact(ref: str) -> str | None:
        asked.append(ref)
        return "changed: the file now holds 5 bytes that hash to sha256:" + "b" * 64

    verdict = evaluate(
        state, SPEC, now=NOW, hash_file={"out.txt": H_AFTER}.get, check_artifact=check_artifact
    )
    assert asked == [output.ref]  # the output the observation is rebuilt from
    assert verdict.outcome == "blocked"
    failing = verdict.failing()
    assert failing.startswith(f"artifacts intact: stdout ({output.ref}, 5 bytes recorded): changed")
    assert "restore them from a backup" in failing
    fine = evaluate(state, SPEC, now=NOW, hash_file={"out.txt": H_AFTER}.get,
                    check_artifact=lambda ref: None)  # fmt: skip
    assert fine.ok
    assert fine.checks[3].as_dict() == {
        "name": "artifacts intact",
        "ok": True,
        "detail": "1 needed artifact(s) have their hash",
    }


SIDE_EFFECTS = ("none", "read", "workspace-write", "external-write")
IDEMPOTENCIES = ("safe", "conditional", "unsafe")
RESUMES = ("replay-from-event", "rerun-after-check", "require-user-confirmation", "never-rerun")


@pytest.mark.parametrize("writes", [(), ("out.txt",)], ids=["no-writes", "writes"])
def test_a_start_may_be_lost_only_where_the_gate_would_rerun_it(writes: tuple[str, ...]) -> None:
    """runs/steps.py writes the start of a step ``rerun_harmless`` admits without
    waiting for the disk: losing it must end as the gate's ``tool.started`` row
    would (run again), whatever the workspace, and only read-only safe steps
    qualify."""
    admitted = []
    for side_effect, idempotency, resume in itertools.product(SIDE_EFFECTS, IDEMPOTENCIES, RESUMES):
        risk = RiskContract(side_effect=side_effect, idempotency=idempotency, resume=resume)
        if not rerun_harmless(risk, writes):
            continue
        admitted.append((side_effect, idempotency, resume))
        # the gate's table reruns it, with its paths changed or not (it has none)
        recorded = cast(RiskJson, risk.model_dump())
        assert rerun_refusal(recorded, {}, lambda _p: "changed", "cut off") is None
    if writes:
        assert admitted == []  # paths to check: the start is the check's record
    else:
        assert sorted(admitted) == [
            (effect, "safe", resume)
            for effect in ("none", "read")
            for resume in ("replay-from-event", "rerun-after-check")
        ]
