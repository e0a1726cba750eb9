"""The daemon side of the session SDK: the ``sdk.*`` RPC methods.

Each call is made with a run token (runs.tokens) and appends to that run's
session only. Every answer carries ``stop``: true once the daemon wants the
program to stop at its next stable point (interrupt, suspend, cancel, shutdown,
a pending approval, a spent budget).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from sessiond.errors import InvalidInput, Refused
from sessiond.log.event_data import (
    MessageReceived,
    VerificationFinished,
    VerificationStarted,
)
from sessiond.log.pace import batches
from sessiond.log.projections import PAGE_DEFAULT, hidden, messages_page, transcript_item
from sessiond.log.replay import replay
from sessiond.log.state import State
from sessiond.log.store.base import Draft
from sessiond.replies import Sent
from sessiond.runs.context import RunContext
from sessiond.runs.sends import Elsewhere, Sends
from sessiond.runs.steps import Steps
from sessiond.runs.tokens import Tokens
from sessiond.sdkwire import Ack, ContextAnswer, StepAnswer, StepReply, TranscriptItem, TurnContext
from sessiond.table.sessions import Session


def _finished(s: Session, call: str) -> None:
    """Refuse a step sent behind the end of ``call`` if that end was not recorded
    ``ok`` (refused, or never under way): nothing starts after a step that failed."""
    turn = s.journal.state.turn
    slot = turn["calls"].get(call) if turn else None
    step = turn["steps"].get(slot) if turn and slot else None
    if step is None or step["status"] != "ok":
        raise Refused(
            f"this step was sent behind the end of step call {call!r}, which is "
            f"{step['status'] if step else 'not under way'}, not finished ok: it was not started"
        )


# the ``send`` syscall: a message from one session to another (syscalls.lineage), and
# what it answers (where the message went)
Send = Callable[..., Awaitable[Sent]]


class SdkCalls:
    """The ``sdk.*`` calls of a running program, checked against its run token."""

    def __init__(
        self,
        ctx: RunContext,
        tokens: Tokens,
        send: Send,
        elsewhere: Elsewhere | None = None,
    ) -> None:
        self.ctx = ctx
        self.tokens = tokens
        self.send = send  # the ``send`` syscall: on a cluster node, to any node's session
        self.steps = Steps(ctx)
        self.sends = Sends(self.steps, elsewhere)
        # the context each session's open turn began with: (turn, the seq it began
        # after, the fold up to there, the context but its messages)
        self._turn_context: dict[str, tuple[int, int, State, TurnContext]] = {}

    @staticmethod
    def _stop(s: Session) -> bool:
        """Whether the daemon wants the program to stop at its next stable point."""
        return s.run is not None and s.run.stop_requested is not None

    def _answer(self, s: Session, reply: StepReply) -> StepAnswer:
        return {"stop": self._stop(s), **reply}

    # --- calls --------------------------------------------------------------------

    async def sdk_context(
        self, token: str, cursor: int | None = None, limit: int | None = None
    ) -> ContextAnswer:
        """The session as the open turn began: every run of the turn sees the same
        context, so a deterministic program takes the same path each time; what the
        turn itself did comes back through its replayed steps. The messages come a
        page at a time: the first call gives the context with the first page, each
        next call (with the page's ``next_cursor``) the next page only. They are read
        from the log when asked, never kept: a long session's view is large."""
        s, grant = self.tokens.session_for(token)
        state = s.journal.state
        turn = state.turn
        cached = self._turn_context.get(s.name)
        if turn is not None and cached is not None and cached[0] == turn["n"]:
            _n, upto, at_start, context = cached
        else:
            upto = max((turn["seq"] - 1) if turn is not None else state.seq, 1)
            at_start, context = await self._context_at(s, upto)
            if turn is not None:
                context["wakes"] = turn["wakes"]
                context["turn"] = turn["n"]
                self._turn_context[s.name] = (turn["n"], upto, at_start, context)
        page, next_cursor = await messages_page(
            s.journal.read(upto=upto), at_start, cursor=cursor, limit=limit or PAGE_DEFAULT
        )
        stop = self._stop(s)
        if cursor is not None:  # a next page: the rest the first call gave already
            return {"stop": stop, "run": grant.run, "turn": context.get("turn"), "messages": page,
                    "next_cursor": next_cursor}  # fmt: skip
        return {"stop": stop, "run": grant.run, **context, "messages": page,
                "next_cursor": next_cursor}  # fmt: skip

    async def _context_at(self, s: Session, upto: int) -> tuple[State, TurnContext]:
        """The state folded from the log up to ``upto``, and the context a program sees
        of it but its messages; read a slice at a time so the loop serves others."""
        state = State(session=s.name)
        async for batch in batches(s.journal.read(upto=upto)):
            replay(batch, state)
        mailbox: list[TranscriptItem] = []
        if state.mailbox:  # the unread messages' text, from the log (the state keeps seqs)
            unread, summaries = set(state.mailbox), state.summaries
            async for batch in batches(s.journal.read(upto=upto)):
                for record in batch:
                    seq = record["seq"]
                    if seq in unread and not hidden(seq, summaries):
                        item = transcript_item(record)
                        if item is not None:
                            mailbox.append(item)
        return state, {
            "session": s.name,
            "goal": state.goal,
            "state": state.state,
            "seq": state.seq,
            "mailbox": mailbox,
            "wakes": [],
            "approvals": list(state.approvals.values()),
            "profile": state.profile,
        }

    async def sdk_step(self, p: Any) -> StepAnswer:
        """The start of a durable step (runs.steps): replayed, run, ask, denied, stop
        or diverged."""
        s, grant = self.tokens.session_for(p.token)
        if p.after is not None:
            _finished(s, p.after)
        answer = await self.steps.begin(s, grant, p, self._answer)
        spec = s.spec
        if answer["status"] == "run" and p.kind == "tool" and spec is not None:
            # Its end can be refused only for what the session masks: with no
            # pattern and no secret but the token (which the SDK looks for itself),
            # the program need not wait for the answer (sdkwire.StepPipe).
            answer["pipeline"] = not spec.redact and s.masked <= {p.token}
        if answer["status"] == "run" and self.ctx.faults.armed("step-run-answered"):
            # test only: die once the answer is sent (it is written before the loop
            # runs the next callback), before a deferred flush could run
            asyncio.get_running_loop().call_soon(self.ctx.faults.point, "step-run-answered")
        return answer

    async def sdk_step_done(self, p: Any) -> Ack:
        """The end of a step's work: its result or its error, in one write. The
        answer does not wait for the disk: nothing the program does next depends
        on it, and whatever the daemon tells anyone next (the next step's start,
        the run's end) is durable only with it (runs.steps: ``done``)."""
        s, grant = self.tokens.session_for(p.token)
        await self.steps.done(s, grant, p, durable=False)
        self.ctx.faults.point("step-end-written")  # test only: not durable, not answered
        return {"stop": self._stop(s)}

    async def sdk_verify(self, token: str, check: str, ok: bool, output: str) -> Ack:
        s, _grant = self.tokens.session_for(token)
        spec = s.spec
        assert spec is not None
        ref = (
            await asyncio.to_thread(
                self.ctx.store.artifacts(s.name).put,
                r.data(output.encode()) if (r := s.redactor()) else output.encode(),
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
        return {"stop": self._stop(s)}

    async def sdk_send(self, p: Any) -> StepAnswer:
        """A message to another session: a step, so a later run never sends it twice."""
        s, grant = self.tokens.session_for(p.token)
        if p.to == s.name:
            raise InvalidInput("a session cannot send to itself")
        return await self.sends.send(s, grant, p, self.send, self._answer)

    async def sdk_end(self, token: str, intent: str, summary: str) -> Ack:
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
        else:
            # the last step's end is durable before the program is told its run
            # may end: only the last step of a run waits for the disk
            await s.journal.flush()
        return {"stop": self._stop(s)}
