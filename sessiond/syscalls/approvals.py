"""The answering syscalls: approve, deny, resolve; and apply, a new spec.

A session blocked on a question (a pending approval) or on a recovery decision
(a call cut off half way) waits for a person; these record the answer and let
it continue through the gate. ``apply`` gives a live session a new spec or
policy. All four are operator actions (docs/design.md section 8): each records who
took it (``who``: uid, user name and channel, from the peer's credentials), with
the free-text ``by`` as a note beside it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from sessiond.codec import rfc3339
from sessiond.errors import InvalidInput, Refused
from sessiond.log.event_data import (
    ApprovalDenied,
    ApprovalGranted,
    ObservationProjected,
    RecoveryResolved,
    SpecApplied,
    WakeRequested,
)
from sessiond.log.records import ApprovalRecord
from sessiond.log.store.base import Draft
from sessiond.log.turns import bad_steps
from sessiond.replies import SessionDetail, Who, who_fields
from sessiond.runs.context import RunContext
from sessiond.runs.floor import Runs
from sessiond.runs.recover import close_cut_off
from sessiond.runs.workspace import workspace_hasher
from sessiond.syscalls.views import causes_of, detail, gate_verdict
from sessiond.table.recovery import refusal
from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec, spec_to_toml


class Approvals:
    """A person's answers: to an approval asked for, and to a recovery to choose."""

    def __init__(self, ctx: RunContext, runs: Runs) -> None:
        self.ctx = ctx
        self.runs = runs

    async def approve(
        self,
        name: str,
        call: str | None = None,
        by: str = "",
        *,
        who: Who | None = None,
        check: Callable[[ApprovalRecord], None] | None = None,
    ) -> SessionDetail:
        """``check``: called with the pending approval under the session's lock; it
        may raise to refuse (a signed link's: what it was minted for is still so)."""
        s = self.ctx.table.get(name)
        async with s.lock:
            approval = _pending(s, call)
            if check is not None:
                check(approval)
            ttl = s.spec.policy.approval_ttl if s.spec else 3600.0
            expires = rfc3339(self.ctx.store.clock() + int(ttl * 1e9))
            await self.ctx.table.append(
                s,
                ApprovalGranted(
                    call=approval["call"],
                    tool=approval["tool"],
                    args_sha256=approval.get("args_sha256"),
                    by=by,
                    expires_at=expires,
                    **who_fields(who),
                ),
                correlation=approval["call"],
            )
            if s.state == "blocked" and not s.journal.state.pending_approvals():
                await self.ctx.transition(s, "sleeping", why="approve", reason="approved")
        if s.state == "sleeping":
            await self.runs.wake(s, "approval", {"call": approval["call"], "answer": "granted"})
        return detail(s)

    async def deny(
        self,
        name: str,
        call: str | None = None,
        by: str = "",
        reason: str = "",
        *,
        who: Who | None = None,
        check: Callable[[ApprovalRecord], None] | None = None,
    ) -> SessionDetail:
        s = self.ctx.table.get(name)
        async with s.lock:
            approval = _pending(s, call)
            if check is not None:
                check(approval)
            await self.ctx.table.append(
                s,
                ApprovalDenied(
                    call=approval["call"],
                    tool=approval["tool"],
                    by=by,
                    reason=reason,
                    **who_fields(who),
                ),
                correlation=approval["call"],
            )
            if s.state == "blocked" and not s.journal.state.pending_approvals():
                await self.ctx.transition(s, "sleeping", why="deny", reason="approval denied")
        return detail(s)

    # --- recovery ------------------------------------------------------------------

    async def resolve(
        self, name: str, option: str, by: str = "", *, who: Who | None = None
    ) -> SessionDetail:
        """Apply a recovery option to a blocked session, then gate it again.

        ``rerun``: run the half-finished (or failed) step again (it is recorded as cut
        off); ``discard``: drop the pending steps, recorded as abandoned, and end the
        turn, so its program does not start again for it; ``accept``: accept the
        workspace as it is now (its hashes are recorded), and a cut-off step's work as
        done. A divergence (docs/design.md section 8) takes ``accept`` (the new path) or
        ``discard`` (end the turn).
        """
        s = self.ctx.table.get(name)
        async with s.lock:
            if s.state != "blocked":
                raise Refused(
                    f"cannot resolve session {name!r}: it is {s.state}; resolve is for a blocked "
                    "session ('sessionctl show' gives the reason it is blocked)"
                )
            state = s.journal.state
            turn = state.turn
            divergence = turn.get("divergence") if turn else None
            if divergence is not None and option == "rerun":
                raise Refused(
                    f"session {name!r} is blocked on a divergence at step "
                    f"{divergence['ordinal']}: nothing half-finished is there to run again; "
                    "use --accept (continue on the new path) or --discard (end the turn)"
                )
            # Only an option that changes something is taken: one that would leave the
            # session blocked as it is must not say "resolved" (table.recovery).
            verdict = gate_verdict(
                s,
                self.ctx.now(),
                artifacts=self.ctx.store.artifacts(name),
                profiles=self.ctx.config.profiles,
            )
            why = refusal(name, option, causes_of(s, verdict))
            if why is not None:
                raise Refused(why)
            hasher = workspace_hasher(s.spec)
            drafts: list[Draft] = []
            # --discard also drops calls that never started (an expired or revoked
            # approval blocks just as a half-finished call does)
            stages: tuple[str, ...] = ("started", "approval", "approved", "decided", "intent")
            if option != "discard":
                stages = ("started", "approval")
            open_calls = {k: c for k, c in state.calls.items() if c["stage"] in stages}
            # (read now: recording the resolution below moves these calls on)
            cut_off_command = any(
                c["tool"] == "command" and c["stage"] == "started" for c in open_calls.values()
            )
            failed_steps = bad_steps(state)
            failed = [st["call"] for st in failed_steps]
            first = next(iter(sorted(open_calls)), None) or next(iter(failed), None)
            for call_id, call in sorted(open_calls.items()):
                tool = call["tool"]
                if option == "discard":
                    person = (who["user"] if who is not None else "") or by or "a person"
                    text = f"{tool} was abandoned by {person}; it did not complete"
                    drafts.append(
                        Draft(
                            ObservationProjected(
                                call=call_id, tool=tool, text=text, source="discarded"
                            ),
                            correlation=call_id,
                        )
                    )
                elif call["stage"] == "started":
                    verb = (
                        "will run again" if option == "rerun" else "was accepted as it left things"
                    )
                    drafts += close_cut_off(call_id, call, hasher, f"{tool} was cut off and {verb}")
            hashes: dict[str, str | None] = {}
            if option == "accept":
                paths = set(state.bound) | set(state.file_hashes)
                for call in open_calls.values():
                    paths.update(call.get("writes") or [])
                hashes = {p: hasher(p) for p in sorted(paths)}
            spec = s.spec
            # A command run is one tool call. Its program was started for every wake
            # there was, so an accepted or discarded call ends that run: running the
            # program again would repeat the very step the person chose not to repeat.
            failed_command = any(st.get("slot") == "command" for st in failed_steps)
            rests = (
                option != "rerun"
                and (cut_off_command or failed_command)
                and spec is not None
                and spec.run is not None
                and spec.run.kind == "command"
            )
            # A discarded step, or an accepted cut-off command, ends the turn: no later
            # run of it may reach the dropped step again.
            ends_turn = turn is not None and (option == "discard" or rests)
            drafts.append(
                Draft(
                    RecoveryResolved(
                        option=option,
                        call=first if divergence is None else None,
                        hashes=hashes,
                        by=by,
                        ends_turn=ends_turn,
                        **who_fields(who),
                        from_ordinal=divergence["ordinal"]
                        if divergence is not None and option == "accept"
                        else None,
                    )
                )
            )
            await self.ctx.table.append_many(s, drafts)
            if ends_turn or (rests and not s.journal.state.pending_wakes):
                return await self._rest(s, option, accepted=rests and option == "accept")
            await self.ctx.transition(s, "sleeping", why="resolve", reason=f"resolved: --{option}")
            cause = await self.ctx.table.append(
                s, WakeRequested(trigger="resolve", details={"option": option})
            )
            await self.runs.proceed(s, cause)
        return detail(s)

    async def _rest(self, s: Session, option: str, *, accepted: bool) -> SessionDetail:
        """The turn ended by a person's choice: its program is not started again for
        it. Wakes that came meanwhile are new work: they start the next turn."""
        spec = s.spec
        reason = f"resolved: --{option}; the turn ends and its program is not started again"
        if (
            accepted
            and spec is not None
            and not spec.has_triggers
            and not s.journal.state.pending_wakes
        ):
            # its work stands: the session ends the way a finished run ends it
            await self.ctx.transition(
                s, "terminated", why="resolve", reason=reason, outcome="completed"
            )
            return detail(s)
        await self.ctx.transition(s, "sleeping", why="resolve", reason=reason)
        if s.journal.state.pending_wakes and spec is not None and spec.run is not None:
            await self.runs.proceed(s, None)
        return detail(s)

    # --- a new spec ----------------------------------------------------------------

    async def apply(
        self,
        name: str,
        spec: str,
        base: str,
        source: str = "spec",
        by: str = "",
        *,
        who: Who | None = None,
    ) -> SessionDetail:
        """Give session ``name`` the spec ``spec`` (TOML; relative paths from ``base``).

        Recorded (spec.applied) before it is in force. The next gate and run use it:
        an approval the new policy denies is refused by the gate, which judges every
        call by the policy in force now; a running program keeps the environment it
        was started with until it ends."""
        s = self.ctx.table.get(name)
        new = parse_spec(spec, base=Path(base), source=source)
        if new.name != name:
            raise InvalidInput(
                f"{source} is the spec of session {new.name!r}, not {name!r}: apply gives a "
                "session a new spec with its own name"
            )
        if s.state == "terminated":
            raise Refused(f"cannot apply a spec to session {name!r}: it is terminated")
        text = spec_to_toml(new)
        old = s.spec.model_dump(mode="json") if s.spec is not None else {}
        fresh = new.model_dump(mode="json")
        changed = tuple(k for k in fresh if fresh[k] != old.get(k))
        async with s.lock:
            ref = self.ctx.store.artifacts(name).put(text.encode(), "spec.toml", "application/toml")
            await self.ctx.table.append(
                s,
                SpecApplied(
                    spec_sha256=hashlib.sha256(text.encode()).hexdigest(),
                    artifact=ref,
                    changed=changed,
                    by=by,
                    **who_fields(who),
                ),
            )
            self.ctx.store.write_spec(name, text)
            s.spec, s.spec_text = new, text
        if self.ctx.triggers is not None:
            self.ctx.triggers.rearm(s)
        return detail(s)


def _pending(s: Session, call: str | None) -> ApprovalRecord:
    pending = s.journal.state.pending_approvals()
    if not pending:
        raise Refused(f"session {s.name!r} has no pending approval")
    if call is None:
        if len(pending) > 1:
            raise InvalidInput(
                f"session {s.name!r} has {len(pending)} pending approvals "
                f"({', '.join(sorted(pending))}); say which with --call"
            )
        return next(iter(pending.values()))
    if call not in pending:
        raise InvalidInput(
            f"session {s.name!r} has no pending approval for call {call!r}; pending: "
            f"{', '.join(sorted(pending))}"
        )
    return pending[call]
