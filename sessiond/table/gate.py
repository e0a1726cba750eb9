"""The resume gate (docs/design.md section 5): may this session continue, and how?

Every continuation passes it — a wake, ``activate``, an approval answer, the
daemon's own restart. It is a pure function of the replayed state, the spec and
policy in force *now*, the workspace as it is now and the clock; it runs
nothing. The daemon records the result as ``gate.evaluated`` and applies the
verdict: ``ok`` runs, ``suspended`` (budget) waits for the budget to renew,
``blocked`` waits for a person (``resolve --rerun | --discard | --accept``,
``approve``, ``deny``).

Where the last run stopped decides what is safe:

=====================  =====================================================
last event of a call   on resume
=====================  =====================================================
tool.intent            decide the policy again (it may have changed)
policy allow/approved  approval still valid under the policy now? then run
approval.requested     blocked until someone answers
tool.started           replay-from-event and rerun-after-check: rerun when the
                       written paths still have their before-hashes;
                       require-user-confirmation, never-rerun or idempotency
                       unsafe: blocked
tool.finished          rebuild the observation from the finished event
observation.projected  a stable point: nothing to do
=====================  =====================================================

The checks that look at storage are done by the caller and handed in, so this
stays a pure function: ``log_error`` is the "log intact" verdict of the log's
own writer (``EventLog.verify``: the file it appended, as long as its end,
every line since the last check good), ``check_artifact`` says what is wrong
with one stored artifact (``ArtifactStore.verify``: present with its hash).
The artifacts checked are those continuing needs (``State.live_artifacts``):
the outputs and diffs of finished calls whose observation is not recorded yet
(the gate rebuilds it from them), the last run's stdout and stderr (what the
next run and ``show`` start from), the context of a model call waiting for its
answer, and the artifacts attached to what the messages view shows (merges,
compaction summaries). Older evidence is history: ``sessiond fsck`` checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sessiond.log.event_data import RiskContract
from sessiond.log.event_records import DivergenceJson, RiskJson, StepRefJson
from sessiond.log.records import CallRecord
from sessiond.log.state import State
from sessiond.log.turns import bad_steps
from sessiond.replies import GateCheck
from sessiond.table.policy_rules import decide
from sessiond.table.recovery import POLICY_DENIES, RUN_FAILED, Cause, cause, options_of
from sessiond.table.spec import SessionSpec

# What the daemon does for a call before continuing (see GateVerdict.actions).
CLOSE_INTERRUPTED = "close-interrupted"  # started, safe to run again: record it cut off
REBUILD_OBSERVATION = "rebuild-observation"  # finished or denied: record the observation
DROP_UNSTARTED = "drop-unstarted"  # intent not started: the program decides again
KEEP_APPROVED = "keep-approved"  # approved, not started: the same intent runs without asking


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""

    def as_dict(self) -> GateCheck:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class GateVerdict:
    checks: tuple[Check, ...]
    outcome: str  # ok | blocked | suspended
    options: tuple[str, ...] = ()
    actions: dict[str, str] = field(default_factory=dict)  # call -> action
    # why it may not go on, each with the answers that change it (table.recovery)
    causes: tuple[Cause, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def failing(self) -> str:
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)


HashFile = Callable[[str], "str | None"]
# What is wrong with a stored artifact (None: present with its hash).
CheckArtifact = Callable[[str], "str | None"]


def evaluate(
    state: State,
    spec: SessionSpec | None,
    *,
    now: str,
    hash_file: HashFile,
    has_artifact: Callable[[str], bool] | None = None,
    cause_paths: frozenset[str] = frozenset(),
    log_error: str | None = None,
    check_artifact: CheckArtifact | None = None,
) -> GateVerdict:
    """Judge whether ``state`` may continue. ``now`` is RFC 3339 UTC; ``hash_file``
    hashes a workspace-relative path (None: absent); ``cause_paths`` are paths whose
    change is exactly what woke the session (they are not held against it);
    ``log_error`` is what is wrong with the log (None: intact); ``check_artifact``
    what is wrong with an artifact (``has_artifact``, the older form, only says
    whether it is there)."""
    if log_error is not None:
        return GateVerdict(
            (Check("log intact", False, log_error),), "blocked", causes=(cause("log", log_error),)
        )
    checks = [Check("log intact", True, f"replayed to seq {state.seq}")]
    actions: dict[str, str] = {}
    divergence = state.turn["divergence"] if state.turn else None
    if divergence is not None:
        # Nothing else matters until a person picks the path: the recorded one is
        # gone from the program's, and the new one was never checked.
        why = describe_divergence(divergence)
        checks.append(Check("steps match", False, why))
        diverged = (cause("divergence", why),)
        return GateVerdict(tuple(checks), "blocked", options_of(diverged), causes=diverged)
    causes: list[Cause] = []
    blocked = _blocked_by(state, spec)
    if blocked is not None:
        checks.append(Check("last block", False, blocked.detail))
        causes.append(blocked)
    call_causes = _calls(state, spec, now, hash_file, actions)
    call_causes += _failed_steps(state, hash_file)
    causes += call_causes
    call_problems = [c.detail for c in call_causes]
    checks.append(
        Check("tool calls", not call_problems, "; ".join(call_problems) or _calls_summary(actions))
    )
    changed = _workspace(state, hash_file, cause_paths)
    checks.append(
        Check(
            "workspace unchanged",
            not changed,
            ("changed since recorded: " + ", ".join(changed))
            if changed
            else f"{len(state.bound) + len(state.file_hashes)} path(s) match",
        )
    )
    if changed:
        causes.append(cause("workspace", checks[-1].detail))
    checks.append(_artifacts(state, check_artifact, has_artifact))
    if not checks[-1].ok:
        causes.append(cause("artifacts", checks[-1].detail))
    budget = _budget(state, spec, now)
    checks.append(Check("budget left", budget is None, budget or "within budget"))
    if state.state == "blocked" and not causes and budget is None:
        # (only a dry run sees a blocked session: gate, show, resolve; proceed never)
        drop = () if state.turn is not None else ("discard",)
        checks.insert(1, Check("last block", False, state.reason or "blocked"))
        causes.append(cause("blocked", state.reason or "blocked", drop=drop))
    if all(c.ok for c in checks):
        return GateVerdict(tuple(checks), "ok", actions=actions)
    if budget is not None and all(c.ok for c in checks if c.name != "budget left"):
        return GateVerdict(
            tuple(checks), "suspended", actions=actions, causes=(cause("budget", budget),)
        )
    if budget is not None:
        causes.append(cause("budget", budget))
    return GateVerdict(tuple(checks), "blocked", options_of(causes), actions, tuple(causes))


def _blocked_by(state: State, spec: SessionSpec | None) -> Cause | None:
    """A block the daemon recorded outside the gate (a run that failed for good, a
    command the policy denied): while the session is blocked, it stands, so the gate
    says not ok for the same reason ``show`` gives (a resolve moves it on first)."""
    if state.state != "blocked":
        return None
    reason = state.reason
    if reason.startswith(RUN_FAILED):
        # --accept takes a failed step's work as done; with none, it is --rerun again
        extra = ("accept",) if bad_steps(state) else ()
        drop = () if state.turn is not None else ("discard",)
        return cause("run-failed", reason, extra=extra, drop=drop)
    if reason.startswith(POLICY_DENIES):
        allowed = (
            spec is not None
            and spec.run is not None
            and decide(spec.policy, "command", spec.run.side_effect).decision != "deny"
        )
        return cause("policy-denied", reason, extra=("rerun",) if allowed else ())
    return None


def _calls(
    state: State,
    spec: SessionSpec | None,
    now: str,
    hash_file: HashFile,
    actions: dict[str, str],
) -> list[Cause]:
    problems: list[Cause] = []
    policy = spec.policy if spec is not None else None
    for call_id, call in sorted(state.calls.items()):
        stage = call["stage"]
        tool = call["tool"]
        risk = call["risk"]  # None: recorded without its intent (a log cut mid-call)
        label = f"{tool} [{call_id}]"
        if stage == "intent":
            actions[call_id] = DROP_UNSTARTED
        elif stage in ("decided", "approved"):
            if (
                policy is not None
                and decide(policy, tool, risk.get("side_effect", "") if risk else "").decision
                == "deny"
            ):
                problems.append(
                    cause("denied-now", f"{label} is denied by the policy in force now")
                )
                continue
            if stage == "approved":
                approval = state.approvals.get(call_id)
                expires = approval.get("expires_at") if approval else None
                if expires is not None and expires <= now:
                    problems.append(
                        cause("expired", f"the approval of {label} expired at {expires}")
                    )
                    continue
                actions[call_id] = KEEP_APPROVED
            else:
                actions[call_id] = DROP_UNSTARTED
        elif stage == "approval":
            # A command run's own question: its wake is still pending, so a discarded
            # call is asked again by the next turn at once: only an answer changes it.
            again = tool == "command" and bool(state.pending_wakes)
            problems.append(
                cause(
                    "approval",
                    f"{label} waits for approval (sessionctl approve / deny)",
                    drop=("discard",) if again else (),
                )
            )
        elif stage == "started":
            problem = _started(call, hash_file)
            if problem is None:
                actions[call_id] = CLOSE_INTERRUPTED
            else:
                problems.append(cause("cut-off", f"{label} {problem}"))
        elif stage in ("finished", "denied"):
            actions[call_id] = REBUILD_OBSERVATION
    return problems


def _started(call: CallRecord, hash_file: HashFile) -> str | None:
    """Why a started, unfinished call must not be run again (None: it may)."""
    started = call.get("started")
    before = started.get("hashes", {}) if started else {}
    return rerun_refusal(call["risk"], before, hash_file, "started and did not finish")


def rerun_refusal(
    risk: RiskJson | None, before: Mapping[str, str | None], hash_file: HashFile, what: str
) -> str | None:
    """Why a call or step that ``what`` (did not finish, failed) must not run again
    on its own (None: it may). Automatic retries obey this too: they block. (No
    ``risk``: a call recorded without its intent, judged by the default contract's
    resume rule.)"""
    resume = risk.get("resume", "rerun-after-check") if risk else "rerun-after-check"
    if risk and risk.get("idempotency") == "unsafe":
        return f"{what}, and it is not idempotent: a person must decide"
    if resume in ("require-user-confirmation", "never-rerun"):
        return f"{what}, and its resume rule is {resume}"
    if risk and risk.get("side_effect") == "external-write":
        # rerun-after-check compares the paths a call writes; an external write has
        # none to compare, so nothing can show that running it again is safe
        return f"{what}, and it writes outside the workspace: nothing can check it"
    changed = [p for p, digest in sorted(before.items()) if hash_file(p) != digest]
    if changed:
        return f"{what}, and it changed " + ", ".join(changed)
    return None


def rerun_harmless(contract: RiskContract, writes: Sequence[str]) -> bool:
    """Whether a step of this contract, cut off with no record that it started,
    ends as it would with one: its start may be lost in a crash (runs/steps.py
    writes it without waiting for the disk, and answers ``run`` at once).

    Had its start been durable, the table above (``tool.started``) would close it
    as interrupted and run it again: ``rerun_refusal`` finds nothing to refuse in
    a ``safe`` step whose resume rule reruns and which writes no path. With the
    start lost the step looks never started and the program runs it again too:
    the outcome is the same, only the record of an attempt that declared it
    touches nothing (``side_effect`` none or read) is gone. Stricter than
    ``rerun_refusal``: a ``conditional`` step, or one that writes paths (their
    before-hashes are what a rerun is checked against), keeps its start durable."""
    return (
        contract.idempotency == "safe"
        and contract.side_effect in ("none", "read")
        and contract.resume in ("replay-from-event", "rerun-after-check")
        and not writes
    )


def _failed_steps(state: State, hash_file: HashFile) -> list[Cause]:
    """Steps of the open turn that finished with an error: a later run would reach
    them again, so they may run again only where their risk contract allows it."""
    problems: list[Cause] = []
    for step in bad_steps(state):
        stopped = step["status"] == "interrupted"
        why = rerun_refusal(
            step.get("risk"),
            step.get("before") or {},
            hash_file,
            "was stopped before it finished" if stopped else f"failed ({step.get('error')})",
        )
        if why is None:
            continue
        if step.get("slot") == "command":
            problems.append(cause("failed-step", f"the command [{step['call']}] {why}"))
        else:
            what = f"step {step['ordinal']} {step['name']} [{step['call']}] {why}"
            problems.append(cause("failed-step", what))
    return problems


def describe_divergence(d: DivergenceJson) -> str:
    """The reason shown for a divergence: both steps, recorded and asked."""

    def one(ref: StepRefJson) -> str:
        digest = ref.get("digest")
        return f"{ref['kind']} {ref['name']!r}" + (
            f" (args sha256 {digest[:12]})" if digest else ""
        )

    # (divergences recorded before nesting and keys name no slots)
    at = d["asked"].get("slot") or d["ordinal"]
    recorded_at = d["recorded"].get("slot")
    where = "there"
    if recorded_at and recorded_at != at:
        where = f"at step {recorded_at} in its stead"
    return (
        f"the program asked at step {at} for {one(d['asked'])}, but the turn "
        f"recorded {one(d['recorded'])} {where}; 'sessionctl resolve --accept' continues on "
        "the new path, '--discard' ends the turn"
    )


def _calls_summary(actions: dict[str, str]) -> str:
    if not actions:
        return "no tool between intent and observation"
    return ", ".join(f"{call}: {action}" for call, action in sorted(actions.items()))


def _workspace(state: State, hash_file: HashFile, cause_paths: frozenset[str]) -> list[str]:
    changed = []
    for path, recorded in sorted({**state.file_hashes, **state.bound}.items()):
        if path in cause_paths:
            continue
        if hash_file(path) != recorded:
            changed.append(path)
    return changed


def _artifacts(
    state: State, check: CheckArtifact | None, has: Callable[[str], bool] | None
) -> Check:
    if check is None:
        present = has or (lambda _ref: True)

        def check(ref: str) -> str | None:
            return None if present(ref) else "missing"

    needed = state.live_artifacts()
    problems = []
    for ref, meta in needed.items():
        problem = check(ref)
        if problem is not None:
            recorded = f", {meta['size']} bytes recorded" if "size" in meta else ""
            problems.append(f"{meta.get('name') or 'artifact'} ({ref}{recorded}): {problem}")
    if problems:
        problems.sort()
        return Check(
            "artifacts intact",
            False,
            "; ".join(problems) + "; restore them from a backup ('sessiond fsck' lists "
            "every damaged artifact)",
        )
    return Check("artifacts intact", True, f"{len(needed)} needed artifact(s) have their hash")


def _budget(state: State, spec: SessionSpec | None, now: str) -> str | None:
    if spec is None:
        return None
    budget = spec.budget
    today = now[:10]
    runs_today = state.runs_by_day.get(today, 0)
    if budget.runs_per_day and runs_today >= budget.runs_per_day:
        return (
            f"runs_per_day: {runs_today} of {budget.runs_per_day} used today (renews at 00:00 UTC)"
        )
    tokens = state.tokens_in + state.tokens_out
    if budget.tokens and tokens >= budget.tokens:
        return f"tokens: {tokens} of {budget.tokens} used"
    return None
