"""``run.send`` as a durable step: a message to another session, sent at most once
per place in the turn (docs/design.md section 8). The daemon does the work itself, so
intent, decision and start are one durable write, the delivery (the receiver's
own durable append) comes next, and the end is one more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from sessiond.errors import InvalidInput, Refused
from sessiond.log.event_data import (
    ObservationProjected,
    PolicyDecided,
    ToolFinished,
    ToolIntent,
)
from sessiond.log.places import Asked, judge
from sessiond.log.store.base import Draft
from sessiond.runs.steps import ANSWERED, STEP_RISK, Answer, Deliver, Steps, args_hash, stored
from sessiond.runs.tokens import RunGrant
from sessiond.sdkwire import StepAnswer, StepReply
from sessiond.table.policy_rules import decide
from sessiond.table.sessions import Session

# Is a session this node does not have one of the cluster's (on another node)?
Elsewhere = Callable[[str], Awaitable[bool]]


class Sends:
    """``sdk.send``: a step whose work is the daemon's own ``send`` syscall."""

    def __init__(self, steps: Steps, elsewhere: Elsewhere | None = None) -> None:
        self.steps = steps
        self.ctx = steps.ctx
        # A cluster node's (sessiond.cluster.mailbox): is a session this node does
        # not have one of the cluster's? Then the message goes to its owner.
        self.elsewhere = elsewhere

    async def send(
        self, s: Session, grant: RunGrant, p: Any, deliver: Deliver, answer: Answer
    ) -> StepAnswer:
        """``run.send``: a step like any other, so a later run of the turn never sends
        it twice. The policy decides on the tool ``send`` (allowed by default, like a
        command run: it is the session's own act)."""
        spec = s.spec
        assert spec is not None
        args = {"to": p.to, "text_sha256": hashlib.sha256(p.text.encode()).hexdigest()}
        digest = args_hash("send", args)
        async with s.lock:
            turn = s.journal.state.turn
            if turn is None or s.run is None:
                raise Refused("this run has no open turn: a step can only be taken while it runs")
            asked = Asked(
                kind="tool",
                name="send",
                digest=digest,
                ordinal=p.ordinal,
                key=stored(s, p.key),  # as the log keeps it (masked where it matches)
                parent=self.steps.parent(turn, grant, p.parent),
            )
            judged = judge(turn["steps"], asked, grant.run)
            if judged.verdict == "refused":
                raise InvalidInput(judged.why)
            if judged.verdict == "diverged":
                assert judged.recorded is not None
                return answer(s, await self.steps._diverge(s, asked, judged.recorded))
            recorded = judged.recorded
            if recorded is not None and recorded["status"] in ANSWERED:
                if recorded["status"] == "ok":
                    return answer(s, {"status": "replayed", "call": recorded["call"]})
                if recorded["status"] == "denied":
                    return answer(s, {"status": "denied", "rule": recorded.get("rule", "denied")})
                return answer(s, {"status": "ask", "rule": "approval pending"})
            if s.run.stop_requested is not None:
                return answer(s, {"status": "stop", "reason": s.run.stop_requested})
            # A message to no session is refused before the step is recorded: as a
            # failed unsafe step it would block a later run of the turn for a person,
            # though nothing was sent. (A session not opened yet is opened now.)
            await self.ctx.table.ensure(p.to)
            if p.to not in self.ctx.table.sessions and (
                self.elsewhere is None or not await self.elsewhere(p.to)
            ):
                self.ctx.table.get(p.to)  # NoSuchSession, named as on one machine
            call = await self.steps._next_call(s, grant)
            if call is None:
                return answer(s, {"status": "stop", "rule": "budget: tool_calls_per_run"})
            verdict = decide(spec.policy, "send", "external-write")
            rule = verdict.rule
            decision = verdict.decision
            if rule.startswith("default:"):
                decision, rule = "allow", "default: a message to a session is allowed"
            drafts = [
                Draft(
                    ToolIntent(
                        call=call,
                        tool="send",
                        args=args,
                        risk=STEP_RISK,
                        turn=turn["n"],
                        ordinal=p.ordinal,
                        key=p.key,
                        args_sha256=digest,
                        parent=asked.parent,
                    ),
                    correlation=call,
                ),
                Draft(
                    PolicyDecided(call=call, tool="send", decision=decision, rule=rule),
                    correlation=call,
                ),
            ]
            if decision != "allow":
                # asking a person about a message is not offered: it is allowed or denied
                text = f"send to {p.to} was denied by the policy ({rule})"
                drafts[1] = Draft(
                    PolicyDecided(call=call, tool="send", decision="deny", rule=rule),
                    correlation=call,
                )
                drafts.append(
                    Draft(
                        ObservationProjected(call=call, tool="send", text=text, source="denied"),
                        correlation=call,
                    )
                )
                await self.ctx.table.append_many(s, drafts)
                return answer(s, {"status": "denied", "rule": rule})
            drafts.append(self.steps._started_draft(s, grant, call, "send", []))
            await self.ctx.table.append_many(s, drafts)
        # The sender's patterns, secrets and token travel with the text: it leaves
        # masked as the sender's own log would keep it (the receiver masks with its
        # own as well). Delivered outside this session's lock: the receiver's is
        # taken there.
        r = s.redactor()
        text = r.text(p.text) if r is not None else p.text
        try:
            # a Sent here, or as another node's answer decoded it: read by key
            result: Mapping[str, Any] = await deliver(p.to, text, sender=s.name)
            status, text = "ok", f"sent a message to {p.to}"
        except Exception as exc:
            result, status, text = {}, "error", f"send to {p.to} failed: {exc}"
        async with s.lock:
            await self.ctx.table.append_many(
                s,
                [
                    Draft(
                        ToolFinished(
                            call=call,
                            tool="send",
                            status=status,
                            error_class=None if status == "ok" else "execution",
                            result_kind="json" if status == "ok" else None,
                            result=None,
                        ),
                        correlation=call,
                    ),
                    Draft(
                        ObservationProjected(call=call, tool="send", text=text), correlation=call
                    ),
                ],
            )
        if status != "ok":
            raise Refused(text)
        # with what the send syscall answered: where the message went (the session, its
        # seq, whether it woke; on a cluster the node it was left for)
        return answer(s, cast(StepReply, {"status": "run", "call": call, **result}))
