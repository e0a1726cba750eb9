"""The daemon side of the session SDK: the ``sdk.*`` RPC methods.

A run token is issued for one run of one session (``SESSIOND_TOKEN``). It can
append events to that session only, only while the run lasts; anything else is
refused. Tokens live in the daemon's memory only: never in events, logs,
artifacts or bundles.

Every answer carries ``stop``: true once the daemon wants the program to stop at
its next stable point (interrupt, suspend, cancel, shutdown, a pending approval,
a spent budget).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from sessiond.errors import InvalidInput, Refused
from sessiond.log.event_data import (
    ApprovalRequested,
    ArtifactRef,
    BudgetExhausted,
    MessageReceived,
    ModelRequested,
    ModelResponded,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    ToolFinished,
    ToolIntent,
    ToolStarted,
    VerificationFinished,
    VerificationStarted,
)
from sessiond.log.projections import messages
from sessiond.log.store.base import Draft
from sessiond.runs.flow import _read_small, git_head, redact, text_diff, workspace_hasher
from sessiond.table.policy import decide
from sessiond.table.sessions import Session

if TYPE_CHECKING:
    from sessiond.runs.flow import Runs

    Base = Runs
else:
    Base = object


class TokenRefused(Refused):
    """A run token that is unknown, belongs to another session, or to a run that ended."""

    code = "token_refused"


@dataclass
class RunGrant:
    session: str
    run: str
    calls: int = 0
    before: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    exit_intent: str | None = None  # sleep | complete
    summary: str = ""


def args_hash(tool: str, args: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps([tool, args], option=orjson.OPT_SORT_KEYS)).hexdigest()


class SdkCalls(Base):
    tokens: dict[str, RunGrant]

    # --- tokens -------------------------------------------------------------------

    def sdk_env(self, s: Session, run_id: str) -> dict[str, str]:
        token = secrets.token_urlsafe(32)
        self.tokens[token] = RunGrant(s.name, run_id)
        return {"SESSIOND_TOKEN": token, "SESSIOND_SOCKET": str(self.config.socket)}

    def end_run(self, s: Session, run_id: str) -> None:
        for token, grant in list(self.tokens.items()):
            if grant.session == s.name and grant.run == run_id:
                del self.tokens[token]

    def grant_of(self, s: Session) -> RunGrant | None:
        run = s.run
        if run is None:
            return None
        return next(
            (g for g in self.tokens.values() if g.session == s.name and g.run == run.run_id), None
        )

    def check_token(self, token: str, session: str | None) -> None:
        """Refuse a token offered for a session other than its own."""
        grant = self.tokens.get(token)
        if grant is not None and session is not None and grant.session != session:
            raise TokenRefused(
                f"this run token belongs to session {grant.session!r}, not {session!r}"
            )
        self._session_for(token)

    def _session_for(self, token: str) -> tuple[Session, RunGrant]:
        grant = self.tokens.get(token)
        if grant is None:
            raise TokenRefused(
                "this run token is not valid: it belongs to a run that has ended, or to no run; "
                "a token works only for the run it was issued to"
            )
        s = self.table.get(grant.session)
        if s.run is None or s.run.run_id != grant.run:
            raise TokenRefused(f"the run {grant.run} of session {grant.session!r} has ended")
        return s, grant

    def _answer(self, s: Session, **values: Any) -> dict[str, Any]:
        stop = s.run is not None and s.run.stop_requested is not None
        return {"stop": stop, **values}

    # --- calls --------------------------------------------------------------------

    async def sdk_context(self, token: str) -> dict[str, Any]:
        s, grant = self._session_for(token)
        state = s.j.state
        unread = set(state.mailbox)
        return self._answer(
            s,
            session=s.name,
            run=grant.run,
            goal=state.goal,
            state=state.state,
            seq=state.seq,
            messages=messages(state),
            mailbox=[t for t in state.transcript if t["seq"] in unread],
            wakes=(state.current_run or {}).get("wakes", []),
            approvals=list(state.approvals.values()),
            profile=state.profile,
        )

    async def sdk_tool(
        self, token: str, tool: str, args: dict[str, Any], writes: list[str], risk: dict[str, str]
    ) -> dict[str, Any]:
        s, grant = self._session_for(token)
        spec = s.spec
        assert spec is not None
        contract = RiskContract.model_validate(risk)
        digest = args_hash(tool, args)
        async with s.lock:
            state = s.j.state
            for call_id, call in state.calls.items():
                approval = state.approvals.get(call_id, {})
                if (
                    call["tool"] == tool
                    and call["stage"] == "approved"
                    and approval.get("args_sha256") == digest
                ):
                    # The same intent, already approved: no second question.
                    return self._answer(s, call=call_id, decision="allow", rule="approved earlier")
            limit = spec.budget.tool_calls_per_run
            if limit and grant.calls >= limit:
                await self.table.append(
                    s, BudgetExhausted(budget="tool_calls_per_run", limit=limit, used=grant.calls)
                )
                if s.run is not None and s.run.stop_requested is None:
                    s.run.stop_requested = f"budget: tool_calls_per_run {limit} used up"
                return self._answer(
                    s, call=None, decision="stop", rule="budget: tool_calls_per_run"
                )
            grant.calls += 1
            call_id = f"{grant.run}.{grant.calls}"
            verdict = decide(spec.policy, tool, contract.side_effect)
            drafts = [
                Draft(
                    ToolIntent(
                        call=call_id, tool=tool, args=args, risk=contract, writes=tuple(writes)
                    ),
                    correlation=call_id,
                ),
                Draft(
                    PolicyDecided(
                        call=call_id, tool=tool, decision=verdict.decision, rule=verdict.rule
                    ),
                    correlation=call_id,
                ),
            ]
            if verdict.decision == "deny":
                text = f"{tool} was denied by the policy ({verdict.rule})"
                drafts.append(
                    Draft(
                        ObservationProjected(call=call_id, tool=tool, text=text, source="denied"),
                        correlation=call_id,
                    )
                )
            elif verdict.decision == "ask":
                drafts.append(
                    Draft(
                        ApprovalRequested(call=call_id, tool=tool, args_sha256=digest),
                        correlation=call_id,
                    )
                )
                if s.run is not None and s.run.stop_requested is None:
                    s.run.stop_requested = f"approval pending for {tool} [{call_id}]"
            await self.table.append_many(s, drafts)
        return self._answer(s, call=call_id, decision=verdict.decision, rule=verdict.rule)

    async def sdk_started(self, token: str, call: str) -> dict[str, Any]:
        s, grant = self._session_for(token)
        async with s.lock:
            c = s.j.state.calls.get(call)
            if (
                c is None
                or c["stage"] not in ("decided", "approved")
                or c.get("decision") == "deny"
            ):
                raise Refused(f"call {call!r} is not allowed to start (it is {c and c['stage']})")
            spec = s.spec
            assert spec is not None
            hasher = workspace_hasher(spec)
            writes = c.get("writes") or []
            grant.before[call] = {p: _read_small(spec.workspace / p) for p in writes}
            await self.table.append(
                s,
                ToolStarted(
                    call=call,
                    tool=c["tool"],
                    hashes={p: hasher(p) for p in writes},
                    git_head=git_head(spec.workspace),
                ),
                correlation=call,
            )
        return self._answer(s)

    async def sdk_finished(
        self,
        token: str,
        call: str,
        *,
        status: str,
        output: str,
        observation: str,
        exit_code: int | None,
        error_class: str | None,
    ) -> dict[str, Any]:
        s, grant = self._session_for(token)
        async with s.lock:
            c = s.j.state.calls.get(call)
            if c is None or c["stage"] != "started":
                raise Refused(f"call {call!r} has not started")
            spec = s.spec
            assert spec is not None
            artifacts = self.store.artifacts(s.name)
            out_ref = (
                artifacts.put(
                    redact(output.encode(), spec.redact), f"{c['tool']}.out", "text/plain"
                )
                if output
                else None
            )
            before = grant.before.pop(call, {})
            diff_bytes = text_diff(before, spec.workspace)
            diff_ref = (
                artifacts.put(redact(diff_bytes, spec.redact), "diff", "text/x-diff")
                if diff_bytes
                else None
            )
            hasher = workspace_hasher(spec)
            text = observation or f"{c['tool']} {status}"
            await self.table.append_many(
                s,
                [
                    Draft(
                        ToolFinished(
                            call=call,
                            tool=c["tool"],
                            status=status,
                            exit_code=exit_code,
                            error_class=error_class,
                            hashes={p: hasher(p) for p in c.get("writes") or []},
                            output=out_ref,
                            diff=diff_ref,
                        ),
                        correlation=call,
                    ),
                    Draft(
                        ObservationProjected(call=call, tool=c["tool"], text=text), correlation=call
                    ),
                ],
            )
        return self._answer(s)

    async def sdk_model(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        s, _grant = self._session_for(token)
        spec = s.spec
        assert spec is not None
        artifacts = self.store.artifacts(s.name)
        context = artifacts.put(
            redact(orjson.dumps(params["request"]), spec.redact), "context.json", "application/json"
        )
        response: ArtifactRef | None = artifacts.put(
            redact(orjson.dumps(params["response"]), spec.redact),
            "response.json",
            "application/json",
        )
        tools = params.get("tools") or []
        request_id = params.get("request_id") or secrets.token_hex(8)
        async with s.lock:
            await self.table.append_many(
                s,
                [
                    Draft(
                        ModelRequested(
                            model=params["model"],
                            request_id=request_id,
                            context=context,
                            tools_sha256=hashlib.sha256(
                                orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
                            ).hexdigest(),
                            tool_count=len(tools),
                        )
                    ),
                    Draft(
                        ModelResponded(
                            model=params["model"],
                            request_id=request_id,
                            status=params.get("status", "ok"),
                            tokens_in=params.get("tokens_in", 0),
                            tokens_out=params.get("tokens_out", 0),
                            duration_ms=params.get("duration_ms", 0),
                            text=params.get("text", ""),
                            response=response,
                        )
                    ),
                ],
            )
            state = s.j.state
            limit = spec.budget.tokens
            used = state.tokens_in + state.tokens_out
            if limit and used >= limit:
                await self.table.append(s, BudgetExhausted(budget="tokens", limit=limit, used=used))
                if s.run is not None and s.run.stop_requested is None:
                    s.run.stop_requested = f"budget: tokens {used} of {limit} used"
        return self._answer(s, request_id=request_id)

    async def sdk_verify(self, token: str, check: str, ok: bool, output: str) -> dict[str, Any]:
        s, _grant = self._session_for(token)
        spec = s.spec
        assert spec is not None
        ref = (
            self.store.artifacts(s.name).put(
                redact(output.encode(), spec.redact), "verification", "text/plain"
            )
            if output
            else None
        )
        async with s.lock:
            await self.table.append_many(
                s,
                [
                    Draft(VerificationStarted(check=check)),
                    Draft(VerificationFinished(check=check, ok=ok, output=ref)),
                ],
            )
        return self._answer(s)

    async def sdk_send(self, token: str, to: str, text: str) -> dict[str, Any]:
        s, _grant = self._session_for(token)
        if to == s.name:
            raise InvalidInput("a session cannot send to itself")
        result: dict[str, Any] = await self.send(to, text, sender=s.name)  # type: ignore[attr-defined]
        return self._answer(s, **result)

    async def sdk_end(self, token: str, intent: str, summary: str) -> dict[str, Any]:
        """The program says how its run ends: ``sleep`` (wait for the next wake) or
        ``complete`` (the session's work is done)."""
        s, grant = self._session_for(token)
        if intent not in ("sleep", "complete"):
            raise InvalidInput("a run ends with sleep or complete")
        grant.exit_intent = intent
        grant.summary = summary
        if summary:
            async with s.lock:
                await self.table.append(
                    s, MessageReceived(sender=s.name, text=summary, role="agent")
                )
        return self._answer(s)
