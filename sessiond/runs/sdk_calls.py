"""The daemon side of the session SDK: the ``sdk.*`` RPC methods.

Each call is made with a run token (runs.tokens) and appends to that run's
session only. Every answer carries ``stop``: true once the daemon wants the
program to stop at its next stable point (interrupt, suspend, cancel, shutdown,
a pending approval, a spent budget).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

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
from sessiond.runs.context import RunContext
from sessiond.runs.tokens import Tokens
from sessiond.runs.workspace import git_head, read_small, redact, text_diff, workspace_hasher
from sessiond.table.policy import decide
from sessiond.table.sessions import Session

# the ``send`` syscall: a message from one session to another (syscalls.lineage)
Send = Callable[..., Awaitable[dict[str, Any]]]


def args_hash(tool: str, args: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps([tool, args], option=orjson.OPT_SORT_KEYS)).hexdigest()


class SdkCalls:
    """The ``sdk.*`` calls of a running program, checked against its run token."""

    def __init__(self, ctx: RunContext, tokens: Tokens, send: Send) -> None:
        self.ctx = ctx
        self.tokens = tokens
        self.send = send

    def _answer(self, s: Session, **values: Any) -> dict[str, Any]:
        stop = s.run is not None and s.run.stop_requested is not None
        return {"stop": stop, **values}

    # --- calls --------------------------------------------------------------------

    async def sdk_context(self, token: str) -> dict[str, Any]:
        s, grant = self.tokens.session_for(token)
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
        s, grant = self.tokens.session_for(token)
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
                await self.ctx.table.append(
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
            await self.ctx.table.append_many(s, drafts)
        return self._answer(s, call=call_id, decision=verdict.decision, rule=verdict.rule)

    async def sdk_started(self, token: str, call: str) -> dict[str, Any]:
        s, grant = self.tokens.session_for(token)
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
            grant.before[call] = {p: read_small(spec.workspace / p) for p in writes}
            await self.ctx.table.append(
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
        s, grant = self.tokens.session_for(token)
        async with s.lock:
            c = s.j.state.calls.get(call)
            if c is None or c["stage"] != "started":
                raise Refused(f"call {call!r} has not started")
            spec = s.spec
            assert spec is not None
            artifacts = self.ctx.store.artifacts(s.name)
            # Hashing and an fsync each: in a thread, off the loop (issue 13).
            out_ref = (
                await asyncio.to_thread(
                    artifacts.put,
                    redact(output.encode(), spec.redact),
                    f"{c['tool']}.out",
                    "text/plain",
                )
                if output
                else None
            )
            before = grant.before.pop(call, {})
            diff_bytes = text_diff(before, spec.workspace)
            diff_ref = (
                await asyncio.to_thread(
                    artifacts.put, redact(diff_bytes, spec.redact), "diff", "text/x-diff"
                )
                if diff_bytes
                else None
            )
            hasher = workspace_hasher(spec)
            text = observation or f"{c['tool']} {status}"
            await self.ctx.table.append_many(
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
        s, _grant = self.tokens.session_for(token)
        spec = s.spec
        assert spec is not None
        artifacts = self.ctx.store.artifacts(s.name)
        context = await asyncio.to_thread(
            artifacts.put,
            redact(orjson.dumps(params["request"]), spec.redact),
            "context.json",
            "application/json",
        )
        response: ArtifactRef | None = await asyncio.to_thread(
            artifacts.put,
            redact(orjson.dumps(params["response"]), spec.redact),
            "response.json",
            "application/json",
        )
        tools = params.get("tools") or []
        request_id = params.get("request_id") or secrets.token_hex(8)
        async with s.lock:
            await self.ctx.table.append_many(
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
                await self.ctx.table.append(
                    s, BudgetExhausted(budget="tokens", limit=limit, used=used)
                )
                if s.run is not None and s.run.stop_requested is None:
                    s.run.stop_requested = f"budget: tokens {used} of {limit} used"
        return self._answer(s, request_id=request_id)

    async def sdk_verify(self, token: str, check: str, ok: bool, output: str) -> dict[str, Any]:
        s, _grant = self.tokens.session_for(token)
        spec = s.spec
        assert spec is not None
        ref = (
            await asyncio.to_thread(
                self.ctx.store.artifacts(s.name).put,
                redact(output.encode(), spec.redact),
                "verification",
                "text/plain",
            )
            if output
            else None
        )
        async with s.lock:
            await self.ctx.table.append_many(
                s,
                [
                    Draft(VerificationStarted(check=check)),
                    Draft(VerificationFinished(check=check, ok=ok, output=ref)),
                ],
            )
        return self._answer(s)

    async def sdk_send(self, token: str, to: str, text: str) -> dict[str, Any]:
        s, _grant = self.tokens.session_for(token)
        if to == s.name:
            raise InvalidInput("a session cannot send to itself")
        result: dict[str, Any] = await self.send(to, text, sender=s.name)
        return self._answer(s, **result)

    async def sdk_end(self, token: str, intent: str, summary: str) -> dict[str, Any]:
        """The program says how its run ends: ``sleep`` (wait for the next wake) or
        ``complete`` (the session's work is done)."""
        s, grant = self.tokens.session_for(token)
        if intent not in ("sleep", "complete"):
            raise InvalidInput("a run ends with sleep or complete")
        grant.exit_intent = intent
        grant.summary = summary
        if summary:
            async with s.lock:
                await self.ctx.table.append(
                    s, MessageReceived(sender=s.name, text=summary, role="agent")
                )
        return self._answer(s)
