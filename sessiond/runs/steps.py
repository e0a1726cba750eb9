"""Durable steps, the daemon's side (docs/design.md section 8).

An ``sdk`` program is a sequence of steps: tool calls and model calls. The SDK
asks ``sdk.step`` before each one's work, with the step's place in the turn (its
ordinal or key, inside its parent's for a nested step) and what it is (kind, name,
args digest, key: its identity, judged by log/places.py). The answer is one of

``replayed``  the turn recorded this step finished ``ok``: here is its result;
              the work is not done again (no fsync, nothing appended)
``run``       do the work now, then ``sdk.step_done`` (intent, policy decision
              and start in one write, durable first unless a rerun is harmless)
``ask``       a person must approve; the run stops here (``ApprovalPending``)
``denied``    the policy or a person said no, in every run of the turn
``stop``      the daemon wants the program to stop at this stable point
``diverged``  another step is recorded at this place (whatever its status): nothing
              runs, the session is blocked for a person (``resolve --accept |
              --discard``)

``sdk.step_done`` records the end (``tool.finished`` with the result, and the
observation; or ``model.responded``) in one write that the next durable start, the
run's end or ``END_WITHIN`` makes durable (docs/design.md section 8): a step costs
one fsync, a replayed one none, one whose rerun is harmless (gate.rerun_harmless)
none of its own. A result matching ``redact`` is refused before anything is recorded.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from pydantic import ValidationError

from sessiond.errors import InvalidInput, Refused
from sessiond.log.chunks import put_context
from sessiond.log.event_data import (
    ApprovalRequested,
    ArtifactRef,
    BudgetExhausted,
    ModelRequested,
    ModelResponded,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    ToolFinished,
    ToolIntent,
    ToolStarted,
)
from sessiond.log.places import Asked, judge
from sessiond.log.records import StepRecord, TurnRecord
from sessiond.log.store.base import Draft
from sessiond.log.store.disk import on_disk
from sessiond.redaction import matches
from sessiond.replies import Sent
from sessiond.runs import wrapping
from sessiond.runs.asking import Asking
from sessiond.runs.context import RunContext
from sessiond.runs.places import divergence, parent_slot, stopped
from sessiond.runs.tokens import RunGrant
from sessiond.runs.workspace import git_head, read_in, text_diff, workspace_hasher
from sessiond.sdkwire import AnswerStatus, StepAnswer, StepReply
from sessiond.table.gate import rerun_harmless
from sessiond.table.policy_rules import decide
from sessiond.table.sessions import Session
from sessiond.table.spec import under_profile

# How an answer is made: the reply plus ``stop`` (runs.sdk_calls)
Answer = Callable[[Session, StepReply], StepAnswer]
# the ``send`` syscall, and what it answers (where the message went: runs.sends)
Deliver = Callable[..., Awaitable[Sent]]


# Results up to this size are kept in the event itself (no artifact: no extra
# fsync); bigger ones, and bytes, go to the artifact store.
INLINE_RESULT = 16 * 1024

# Seconds the end of a step waits for a later durable write to cover it: the next
# step's start comes first, and what a power cut can take stays bounded.
END_WITHIN = 0.005

# The default risk contract of a step: the safe one (docs/design.md section 8).
STEP_RISK = RiskContract(side_effect="external-write", idempotency="unsafe", resume="never-rerun")

# Steps are answered from these statuses of the step recorded at the same slot.
ANSWERED = frozenset({"ok", "denied", "approval", "approved"})


def digest_of(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


# args: a tool call's arguments as the program gave them, any JSON
def args_hash(tool: str, args: Mapping[str, Any]) -> str:
    return digest_of([tool, args])


def tool_list(request: Any) -> dict[str, Any]:  # ModelRequested's keyword arguments
    """The hash and size of the tool list a model request shows the model (its
    ``tools``, in every API's request), for ``model.requested``."""
    tools = request.get("tools") if isinstance(request, dict) else None
    if not isinstance(tools, list) or not tools:
        return {}
    return {"tools_sha256": digest_of(tools), "tool_count": len(tools)}


def _mask(s: Session, data: bytes) -> bytes:
    """``data`` as the session stores it: its ``redact`` patterns, its secrets' values
    and its run token masked (event text is masked as it is appended)."""
    r = s.redactor()
    return r.data(data) if r is not None else data


def stored(s: Session, value: str | None) -> str | None:
    """A step's key or name as the log keeps it: masked as a name (log.masking), so
    the step is looked up, compared and shown as recorded."""
    r = s.redactor()
    return r.ident(value) if r is not None and value else value


def step_key(session: str, turn: int, slot: str) -> str:
    """The stable key a program may use for its own idempotency keys (a payment API's)."""
    return f"{session}.t{turn}.{slot}"


def _earlier(call: str, run: str) -> bool:
    """Whether ``call`` (``r3.m1``, ``r3.2``) belongs to a run other than ``run``."""
    return not call.startswith(f"{run}.")


class Steps:
    """``sdk.step`` and ``sdk.step_done`` for one daemon."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        # model steps begun ``early``: their requests being recorded
        self.asking = Asking()

    def _budget(self, s: Session) -> Any:
        """The budget a run under the session's runner profile has (the profile may
        set its own keys)."""
        spec = s.spec
        assert spec is not None
        profile = self.ctx.config.profiles.get(s.journal.state.profile)
        if profile is None or not profile.budget.model_fields_set:
            return spec.budget  # the common case, with nothing to copy
        return under_profile(spec, s.journal.state.profile, self.ctx.config.profiles).budget

    # --- the start of a step ----------------------------------------------------------

    async def begin(
        self,
        s: Session,
        grant: RunGrant,
        p: Any,
        answer: Answer,
        *,
        digest: str | None = None,
        early: bool = False,
    ) -> StepAnswer:
        """Answer ``sdk.step`` (the caller checked the token; ``answer`` adds ``stop``).
        ``digest``: the request's, if the caller has it. ``early``: a model step
        answered ``run`` before its request is recorded (runs.asking)."""
        spec = s.spec
        assert spec is not None
        async with s.lock:
            state = s.journal.state
            turn = state.turn
            if turn is None or s.run is None:
                raise Refused("this run has no open turn: a step can only be taken while it runs")
            if digest is None:
                digest = args_hash(p.name, p.args) if p.kind == "tool" else digest_of(p.request)
            # name and key as the log keeps them (masked where they match a secret), so
            # the step is found and judged against its record
            asked = Asked(
                kind=p.kind,
                name=stored(s, p.name) or p.name,
                digest=digest,
                ordinal=p.ordinal,
                key=stored(s, p.key),
                parent=self.parent(turn, grant, p.parent),
                strict=p.strict,
                key_is_id=p.key_is_id,
            )
            slot = asked.slot
            key = step_key(s.name, turn["n"], slot)
            recorded = turn["steps"].get(slot)
            if (
                recorded is not None
                and recorded["status"] in ("intent", "decided", "started")
                # A model step an earlier run of the turn left waiting for its
                # response (its program or the daemon died): nothing in the world
                # changed, so it is simply asked again.
                and not (recorded["kind"] == "model" and _earlier(recorded["call"], grant.run))
            ):
                raise InvalidInput(
                    f"step {slot} is already under way in this run: each step needs its own "
                    "ordinal or key (pass key= for steps started from threads)"
                )
            # its identity at its place, judged before anything runs
            judged = judge(turn["steps"], asked, grant.run)
            if judged.verdict == "refused":
                raise InvalidInput(judged.why)
            if judged.verdict == "diverged":
                assert judged.recorded is not None
                return answer(s, await self._diverge(s, asked, judged.recorded))
            if recorded is not None and judged.verdict == "same" and recorded["status"] in ANSWERED:
                replied = await self._answer_recorded(s, grant, p, recorded, digest)
                return answer(s, {"key": key, **replied})
            if s.run.stop_requested is not None:
                return answer(s, {"status": "stop", "key": key, "reason": s.run.stop_requested})
            parent = asked.parent
            if p.kind == "model":
                began = await self._begin_model(
                    s, grant, p, turn, digest, parent=parent, early=early
                )
            else:
                began = await self._begin_tool(s, grant, p, turn, digest, parent=parent)
            return answer(s, {"key": key, **began})

    async def _answer_recorded(
        self, s: Session, grant: RunGrant, p: Any, recorded: StepRecord, digest: str
    ) -> StepReply:
        status = recorded["status"]
        call = recorded["call"]
        if status == "ok":
            if p.kind == "model" and recorded["digest"] != digest:
                # Frameworks put timestamps in requests: the changed request is kept
                # (seen in the log), the recorded response answered.
                await self._request(s, p, call, digest, turn=None, replayed=True)
            return self._replayed(s, call, recorded)
        if status == "denied":
            return {"status": "denied", "call": call, "rule": recorded.get("rule", "denied")}
        if status == "approval":
            if s.run is not None and s.run.stop_requested is None:
                s.run.stop_requested = f"approval pending for {stored(s, p.name)} [{call}]"
            return {"status": "ask", "call": call, "rule": "approval pending"}
        if s.run is not None and s.run.stop_requested is not None:
            # approved, but the run was asked to stop: it starts in a later run
            return {"status": "stop", "call": call, "reason": s.run.stop_requested}
        # approved earlier in this turn: it starts now, exactly once
        writes = list(recorded.get("writes") or [])
        await self.ctx.table.append_many(s, [self._started_draft(s, grant, call, p.name, writes)])
        return {"status": "run", "call": call, "rule": "approved"}

    def _replayed(self, s: Session, call: str, recorded: StepRecord) -> StepReply:
        """A step answered from the log, with its recorded result."""
        kind = recorded.get("result_kind")
        ref = recorded.get("result_ref")
        if ref:
            data = self.ctx.store.artifacts(s.name).get(ref["ref"])
            if kind == "bytes":
                b64 = base64.b64encode(data).decode()
                return {"status": "replayed", "call": call, "result_b64": b64}
            return {"status": "replayed", "call": call, "result": orjson.loads(data)}
        return {"status": "replayed", "call": call, "result": recorded.get("result")}

    def parent(self, turn: TurnRecord, grant: RunGrant, call: str | None) -> str | None:
        return parent_slot(turn, grant, call)

    async def _diverge(self, s: Session, asked: Asked, recorded: StepRecord) -> StepReply:
        """Nothing runs: the session blocks with both steps, recorded and asked."""
        gate, reason = divergence(asked, recorded)
        await self.ctx.table.append(s, gate)
        slot = asked.slot
        if s.run is not None:
            s.run.stop_requested = f"divergence at step {slot}"
        return {"status": "diverged", "call": recorded["call"], "rule": reason}

    async def _begin_tool(
        self,
        s: Session,
        grant: RunGrant,
        p: Any,
        turn: TurnRecord,
        digest: str,
        *,
        parent: str | None,
    ) -> StepReply:
        spec = s.spec
        assert spec is not None
        try:
            contract = RiskContract.model_validate(p.risk) if p.risk else STEP_RISK
        except ValidationError as exc:
            wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise InvalidInput(
                f"step {p.name!r} has a bad risk contract ({wrong}); docs/sdk.md lists the "
                "side_effect, idempotency and resume values"
            ) from None
        call_id = await self._next_call(s, grant)
        if call_id is None:
            return {"status": "stop", "rule": "budget: tool_calls_per_run"}
        verdict = decide(spec.policy, p.name, contract.side_effect)
        drafts = [
            Draft(
                ToolIntent(
                    call=call_id,
                    tool=p.name,
                    args=p.args,
                    risk=contract,
                    writes=tuple(p.writes),
                    turn=turn["n"],
                    ordinal=p.ordinal,
                    key=p.key,
                    args_sha256=digest,
                    parent=parent,
                ),
                correlation=call_id,
            ),
            Draft(
                PolicyDecided(
                    call=call_id, tool=p.name, decision=verdict.decision, rule=verdict.rule
                ),
                correlation=call_id,
            ),
        ]
        status: AnswerStatus = "run"
        if verdict.decision == "deny":
            status = "denied"
            text = f"{p.name} was denied by the policy ({verdict.rule})"
            drafts.append(
                Draft(
                    ObservationProjected(call=call_id, tool=p.name, text=text, source="denied"),
                    correlation=call_id,
                )
            )
        elif verdict.decision == "ask":
            status = "ask"
            drafts.append(
                Draft(
                    ApprovalRequested(call=call_id, tool=p.name, args_sha256=digest),
                    correlation=call_id,
                )
            )
            if s.run is not None and s.run.stop_requested is None:
                s.run.stop_requested = f"approval pending for {stored(s, p.name)} [{call_id}]"
        else:
            drafts.append(self._started_draft(s, grant, call_id, p.name, list(p.writes)))
        # intent, decision, start (or question): one write, durable first unless harmless
        await self._write(s, drafts, not (status == "run" and rerun_harmless(contract, p.writes)))
        return {"status": status, "call": call_id, "rule": verdict.rule}

    async def _next_call(self, s: Session, grant: RunGrant) -> str | None:
        """A new call id, or None once the run's tool-call budget is spent (recorded)."""
        spec = s.spec
        assert spec is not None
        limit = self._budget(s).tool_calls_per_run
        if limit and grant.calls >= limit:
            await self.ctx.table.append(
                s, BudgetExhausted(budget="tool_calls_per_run", limit=limit, used=grant.calls)
            )
            if s.run is not None and s.run.stop_requested is None:
                s.run.stop_requested = f"budget: tool_calls_per_run {limit} used up"
            return None
        grant.calls += 1
        return f"{grant.run}.{grant.calls}"

    def _started_draft(
        self, s: Session, grant: RunGrant, call: str, tool: str, writes: list[str]
    ) -> Draft:
        spec = s.spec
        assert spec is not None
        hasher = workspace_hasher(spec)
        grant.before[call] = {w: read_in(spec.workspace, w) for w in writes}
        return Draft(
            ToolStarted(
                call=call,
                tool=tool,
                hashes={w: hasher(w) for w in writes},
                git_head=git_head(spec.workspace) if writes else None,  # a probe: only then
            ),
            correlation=call,
        )

    async def _begin_model(
        self,
        s: Session,
        grant: RunGrant,
        p: Any,
        turn: TurnRecord,
        digest: str,
        *,
        parent: str | None,
        early: bool,
    ) -> StepReply:
        grant.calls_model += 1
        call_id = f"{grant.run}.m{grant.calls_model}"
        if early:  # the gateway sends the call while its request is stored (runs.asking)
            record = self._early(s, grant, p, call_id, digest, turn=turn["n"], parent=parent)
            self.asking.start(s.name, call_id, record)
        else:
            await self._request(s, p, call_id, digest, turn=turn["n"], parent=parent)
            wrapping.opened(grant, call_id)  # the SDK's: its fn may call the gateway
        return {"status": "run", "call": call_id, "rule": "a model call"}

    async def _early(
        self, s: Session, grant: RunGrant, p: Any, call: str, digest: str, *, turn: int,
        parent: str | None,
    ) -> None:  # fmt: skip
        context = await self._context(s, p)
        # then under the lock, as a begin's append is, and only while the run that
        # asked is the session's: a run gone meanwhile records nothing of the call
        # (whose answer ``done`` then refuses)
        async with s.lock:
            if s.run is None or s.run.run_id != grant.run:
                raise Refused(f"run {grant.run} ended before its model call was recorded")
            await self._requested(s, p, call, digest, context, turn=turn, parent=parent)

    async def _context(self, s: Session, p: Any) -> ArtifactRef:
        """A model step's exact request stored (hashing and fsyncs: in a disk thread,
        off the loop), as chunks shared with the turn's other calls (log/chunks.py):
        an agent re-sends its history with every call, which stored whole is O(n^2)."""
        artifacts = self.ctx.store.artifacts(s.name)
        # masked as a value, then encoded: a secret holding a quote or a backslash
        # is escaped in the JSON, where its raw form is not found
        data = orjson.dumps(r.walk(p.request) if (r := s.redactor()) is not None else p.request)
        return await on_disk(lambda: put_context(artifacts, data, "context.json"))

    async def _request(
        self, s: Session, p: Any, call: str, digest: str, *, turn: int | None,
        replayed: bool = False, parent: str | None = None,
    ) -> None:  # fmt: skip
        """Record a model step's request: its context, then ``model.requested``."""
        context = await self._context(s, p)
        await self._requested(s, p, call, digest, context, turn=turn, replayed=replayed,
                              parent=parent)  # fmt: skip

    async def _requested(
        self, s: Session, p: Any, call: str, digest: str, context: ArtifactRef, *,
        turn: int | None, replayed: bool = False, parent: str | None = None,
    ) -> None:  # fmt: skip
        """``model.requested``, not made durable on its own: a model call changes
        nothing in the world, so one whose request a crash lost is simply asked
        again; the response's durable write covers this line."""
        await self.ctx.table.append(
            s,
            ModelRequested(
                model=p.name, request_id=call, context=context, turn=turn, ordinal=p.ordinal,
                key=p.key, request_sha256=digest, replayed=replayed, parent=parent,
                **tool_list(p.request),
            ),
            durable=False,
        )  # fmt: skip

    # --- the end of a step -----------------------------------------------------------

    async def done(self, s: Session, grant: RunGrant, p: Any, *, durable: bool = True) -> None:
        """Record a step's end; ``durable=False`` (``sdk.step_done``): not waited for."""
        spec = s.spec
        assert spec is not None
        await self.asking.recorded(s.name, p.call)
        if p.result_b64 is not None:
            try:
                data = base64.b64decode(p.result_b64, validate=True)
            except ValueError:
                raise InvalidInput("result_b64 is not valid base64") from None
            kind, encoded = "bytes", data
        else:
            kind, encoded = "json", orjson.dumps(p.result)
        async with s.lock:
            state = s.journal.state
            turn = state.turn
            slot = turn["calls"].get(p.call) if turn else None
            step = turn["steps"].get(slot) if turn and slot else None
            if turn is None or step is None or step["status"] != "started":
                raise Refused(
                    f"step call {p.call!r} is not under way in this run (it is "
                    f"{step and step['status']}); sdk.step_done answers an sdk.step 'run'"
                )
            if p.status == "stopped":
                wrapping.wrapped(grant, p.call, None)  # (a model step's frame is over)
                await self._write(s, stopped(s, grant, p.call, step, turn), durable)
                return
            refused = None
            if p.status == "ok":
                value = encoded if kind == "bytes" else p.result
                where = matches(s.redactor(), value)
                if where is not None:
                    what = "response" if step["kind"] == "model" else "result"
                    refused = (
                        f"the {what} of step {step['ordinal']} ({step['name']}) holds what the "
                        f"session masks (a redact pattern, a secret or a run token) at {where}: "
                        f"a masked {what} could not be replayed; return one without the secret "
                        "(a reference to it, say)"
                    )
            if step["kind"] == "model":
                wraps = wrapping.wrapped(grant, p.call, p.result)
                await self._done_model(s, p, step, encoded, refused, wraps=wraps, durable=durable)
            else:
                await self._done_tool(s, grant, p, step, kind=kind, encoded=encoded,
                                      refused=refused, durable=durable)  # fmt: skip
        if refused is not None:
            raise InvalidInput(refused)

    async def _done_tool(
        self,
        s: Session,
        grant: RunGrant,
        p: Any,
        step: StepRecord,
        *,
        kind: str,
        encoded: bytes,
        refused: str | None,
        durable: bool,
    ) -> None:
        spec = s.spec
        assert spec is not None
        artifacts = self.ctx.store.artifacts(s.name)
        call, tool = step["call"], step["name"]
        ok = p.status == "ok" and refused is None
        result: Any = None
        result_ref: ArtifactRef | None = None
        if ok and (kind == "bytes" or len(encoded) > INLINE_RESULT):
            media = "application/octet-stream" if kind == "bytes" else "application/json"
            result_ref = artifacts.put(encoded, f"{tool}.result", media)
        elif ok:
            result = orjson.loads(encoded)
        out = p.output or (p.error if not ok else "") or (refused or "")
        out_ref = (
            artifacts.put(_mask(s, out.encode()), f"{tool}.out", "text/plain") if out else None
        )
        before = grant.before.pop(call, {})
        diff_bytes = text_diff(before, spec.workspace)
        diff_ref = (
            artifacts.put(_mask(s, diff_bytes), "diff", "text/x-diff") if diff_bytes else None
        )
        hasher = workspace_hasher(spec)
        if ok:
            text = p.observation or f"{tool} done"
        else:
            # masked whole, then cut: a secret cut in two would match nothing
            error = refused or p.error
            r = s.redactor()
            text = p.observation or f"{tool} failed: {(r.text(error) if r else error)[:500]}"
        await self._write(
            s,
            [
                Draft(
                    ToolFinished(
                        call=call,
                        tool=tool,
                        status="ok" if ok else "error",
                        error_class=None
                        if ok
                        else ("validation" if refused else p.error_class or "execution"),
                        hashes={w: hasher(w) for w in step.get("writes") or []},
                        output=out_ref,
                        diff=diff_ref,
                        duration_ms=p.duration_ms,
                        result_kind=kind if ok else None,
                        result=result,
                        result_ref=result_ref,
                    ),
                    correlation=call,
                ),
                Draft(
                    ObservationProjected(call=call, tool=tool, text=text),
                    correlation=call,
                ),
            ],
            durable,
        )

    async def _write(self, s: Session, drafts: list[Draft], durable: bool) -> None:
        await self.ctx.table.append_many(s, drafts, durable=durable)
        if not durable:  # covered by a later durable write, or flushed within END_WITHIN
            s.journal.flush_within(END_WITHIN)

    async def _done_model(
        self, s: Session, p: Any, step: StepRecord, encoded: bytes, refused: str | None, *,
        wraps: tuple[str, ...], durable: bool,
    ) -> None:  # fmt: skip
        ok = p.status == "ok" and refused is None
        artifacts = self.ctx.store.artifacts(s.name)
        response = (
            await on_disk(lambda: artifacts.put(encoded, "response.json", "application/json"))
            if ok
            else None
        )
        responded = Draft(
            ModelResponded(
                model=step["name"],
                request_id=step["call"],
                status="ok" if ok else "error",
                duration_ms=p.duration_ms,
                response=response,
                error_class=None if ok else ("validation" if refused else "provider"),
                **wrapping.spend(p, ok, wraps),  # what it wrapped the gateway's steps count
            )
        )
        await self._write(s, [responded], durable)
        state = s.journal.state
        limit = self._budget(s).tokens
        used = state.tokens_in + state.tokens_out
        if ok and limit and used >= limit:
            await self.ctx.table.append(s, BudgetExhausted(budget="tokens", limit=limit, used=used))
            if s.run is not None and s.run.stop_requested is None:
                s.run.stop_requested = f"budget: tokens {used} of {limit} used"
