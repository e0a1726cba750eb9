"""The lineage and context syscalls: fork, merge, send, migrate, compact,
export, import.

They make, join, move and carry sessions: each works on a log as a whole (a
fork's copy, a merge's summary, a bundle) rather than on one run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import structlog

from sessiond.errors import AlreadyExists, InvalidInput, Refused
from sessiond.log.bundle import export_paced, import_session
from sessiond.log.event_data import (
    ApprovalRequested,
    ArtifactRef,
    LifecycleChanged,
    MessageReceived,
    ObservationProjected,
    SessionMerged,
    SessionMigrated,
)
from sessiond.log.lineage import fork as fork_log
from sessiond.redaction import Redactor, redactor
from sessiond.replies import Arrived, Exported, Merged, Sent, SessionDetail
from sessiond.runs.agents import AGENT_KINDS, restore_transcript
from sessiond.runs.context import RunContext
from sessiond.runs.floor import Runs
from sessiond.sdkwire import TranscriptItem
from sessiond.syscalls.handover import Handovers
from sessiond.syscalls.seams import Mail
from sessiond.syscalls.views import detail
from sessiond.table import lifecycle
from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec, spec_to_toml

log = structlog.get_logger(__name__)


class Lineage:
    """Sessions made from, merged into, sent to and moved between others."""

    def __init__(
        self, ctx: RunContext, runs: Runs, handover: Handovers, mail: Mail | None = None
    ) -> None:
        self.ctx = ctx
        self.runs = runs
        self.handover = handover
        self.mail = mail  # a cluster node's: a message for a session another node runs

    async def fork(
        self, name: str, new: str, at: int | None = None, with_triggers: bool = False
    ) -> SessionDetail:
        parent = self.ctx.table.get(name)
        if parent.state == "arriving":  # its copy would be live while this one is held
            raise Refused(
                f"cannot fork session {name!r}: it is arriving (a hand-over from another "
                "daemon not finished yet); fork it once it is settled"
            )
        await self.ctx.table.ensure(new)  # a session not opened yet exists too
        if new in self.ctx.table.sessions:
            raise AlreadyExists(f"session {new!r} exists already; pick another name")
        async with parent.lock:
            child_journal = await fork_log(
                self.ctx.store,
                parent.journal,
                new,
                at_seq=at,
                with_triggers=with_triggers,
                durability=self.ctx.config.durability,
            )
        spec = None
        if parent.spec is not None:
            update: dict[str, object] = {"name": new}  # model_copy's: fields by name
            if not with_triggers:
                update["trigger"] = []
                update["bind"] = parent.spec.bind.model_copy(update={"files": []})
            spec = parent.spec.model_copy(update=update)
            self.ctx.store.write_spec(new, spec_to_toml(spec))
        if spec is not None and spec.run is not None and spec.run.kind in AGENT_KINDS:
            # Before it can run: the child resumes the CLI session as it was at the
            # fork, in a home of its own.
            await asyncio.to_thread(
                restore_transcript, self.ctx.store, self.ctx.config.state_dir, new, spec.run.kind
            )
        child = Session(new, child_journal, spec, None)
        self.ctx.table.adopt(child)
        armed = spec is not None and spec.has_triggers
        inherited = child_journal.state.state
        # An approval was given to the parent for one run of one call: a child that
        # kept it could run that call a second time unasked. It asks again. A
        # question still open (or a call never started) belongs to the parent's
        # turn, which the child does not continue: it would only block the child
        # on a call its own turn never reaches.
        for call_id, call in sorted(child_journal.state.calls.items()):
            if call["stage"] == "approved":
                text = (
                    f"the approval of {call['tool']} [{call_id}] stays with {name}: "
                    "a fork does not inherit an approval it has not used"
                )
            elif call["stage"] in ("approval", "decided", "intent"):
                text = (
                    f"{call['tool']} [{call_id}] stays with {name}: it is of the parent's "
                    "turn, and a fork starts a turn of its own"
                )
            else:
                continue
            await self.ctx.table.append(
                child,
                ObservationProjected(
                    call=call_id, tool=call["tool"], text=text, source="discarded"
                ),
                correlation=call_id,
            )
        await self.ctx.table.append(
            child,
            LifecycleChanged.model_validate(
                {
                    "from": inherited,
                    "to": "sleeping" if armed else "created",
                    "reason": f"forked from {name} at seq {child_journal.state.fork_seq}",
                }
            ),
        )
        if armed and self.ctx.triggers is not None:
            self.ctx.triggers.rearm(child)
        return detail(child)

    async def merge(
        self, child_name: str, into: str | None = None, summary: str | None = None
    ) -> Merged:
        child = self.ctx.table.get(child_name)
        target = into or child.journal.state.parent
        if target is not None:  # the parent it does not name: opened now if not yet
            await self.ctx.table.ensure(target)
        if target is None:
            raise InvalidInput(
                f"session {child_name!r} has no parent; say which session to merge it into "
                "with --into"
            )
        parent = await self._merge_target(child.name, target)
        if parent.name == child.name:
            raise InvalidInput("a session cannot be merged into itself")
        lifecycle.check(child.name, child.state, "terminated", "merge")  # fail fast
        async with self._without_run(child, "merge", parent):
            # Checked again under the locks: the state cannot change from here on.
            lifecycle.check(child.name, child.state, "terminated", "merge")
            if parent.state == "terminated":
                raise Refused(f"cannot merge into session {parent.name!r}: it is terminated")
            cs = child.journal.state
            observed = cs.last_observation["text"] if cs.last_observation else None
            text = summary or observed or _last_said(cs.transcript)
            text = text or f"{child.name} finished at seq {cs.seq}"
            refs = list(cs.live_artifacts().values())
            store = self.ctx.store
            source, dest = store.artifacts(child.name), store.artifacts(parent.name)

            def copy() -> None:  # reads, hashes and fsyncs: in a thread, off the loop
                for ref in refs:
                    dest.put(source.get(ref["ref"]), ref["name"], ref["media_type"])

            await asyncio.to_thread(copy)
            await self.ctx.table.append(
                parent,
                SessionMerged(
                    child=child.name,
                    summary=text,
                    artifacts=tuple(ArtifactRef.model_validate(r) for r in refs),
                    child_seq=cs.seq,
                ),
            )
            await self.ctx.transition(
                child,
                "terminated",
                why="merge",
                reason=f"merged into {parent.name}",
                outcome="merged",
            )
        self._fill_slots()
        return {"parent": detail(parent), "child": detail(child)}

    async def _merge_target(self, child: str, target: str) -> Session:
        """The session to merge ``child`` into; on a cluster, one another node runs is
        refused, saying where it is and what to do: a merge takes both sessions'
        locks and writes to both logs at once, which only one node can do."""
        if target in self.ctx.table.sessions:
            return self.ctx.table.get(target)
        owner = await asyncio.to_thread(self.ctx.store.owner_of, target)
        if owner is None:
            return self.ctx.table.get(target)  # no such session: as on one machine
        here = self.ctx.config.cluster.node
        raise Refused(
            f"cannot merge {child!r} into {target!r}: {target!r} runs on node {owner} and "
            f"{child!r} on node {here}, and a merge needs both on one node; move the child "
            f"there first (`sessionctl migrate {child} --node {owner}`), then merge again"
        )

    @contextlib.asynccontextmanager
    async def _without_run(self, s: Session, why: str, *others: Session) -> AsyncIterator[None]:
        """Hold the locks of ``s`` and ``others`` while ``s`` has no run.

        As cancel does (syscalls.control): a run is stopped first (its settle
        records "stopped for ``why``"), and a start under way is told to spawn
        nothing; the state is only decided on once the locks are held, so no
        start can slip in between. Locks are taken in name order: two merges
        the other way round cannot wait for each other."""
        by_name = {x.name: x for x in (s, *others)}
        locks = [by_name[name].lock for name in sorted(by_name)]
        while True:
            if s.name in self.ctx.scheduler.starting:
                s.stop_pending = why
                log.info("stop.pending", session=s.name, stop=why)
            async with contextlib.AsyncExitStack() as held:
                for lock in locks:
                    await held.enter_async_context(lock)
                s.stop_pending = None
                run = s.run
                if run is None:
                    yield
                    return
                run.stop_requested = why  # read by its settle, which waits for the lock
            await self.runs.stop_run(s, why)

    def _fill_slots(self) -> None:
        """A start that spawned nothing freed its scheduler slot: the next may go."""
        if self.ctx.scheduler.queue:
            self.ctx.spawn(self.runs.dispatch())

    async def send(
        self, to: str, text: str, sender: str = "sessionctl", message_id: str | None = None
    ) -> Sent:
        """``send``: to a session here, or (on a cluster node) left for the node
        that runs it (sessiond.cluster.mailbox delivers it there)."""
        await self.ctx.table.ensure(to)  # a session not opened yet: opened now
        if self.mail is not None and to not in self.ctx.table.sessions:
            posted = await self.mail.post(to, text, sender)
            if posted is not None:
                return posted
            message_id = None  # refused here, as on one machine
        return await self.deliver(to, text, sender, message_id)

    async def deliver(
        self, to: str, text: str, sender: str = "sessionctl", message_id: str | None = None
    ) -> Sent:
        """A message to a session of this node. ``message_id``: the row a message
        carried from another node came by (its commit takes that row: pg/once.py)."""
        s = self.ctx.table.get(to)
        if s.state == "terminated":
            raise Refused(f"cannot send to session {to!r}: it is terminated")
        woke = s.spec is not None and any(t.type == "message" for t in s.spec.trigger)
        # masked before the wake's copy is cut short: a secret cut in two would no
        # longer match its pattern (the log masks both again as they are written)
        r = s.redactor()
        text = r.text(text) if r is not None else text
        async with s.lock:
            # A message that wakes the session is acknowledged only after its wake:
            # it goes to disk with the wake's first commit, not in one of its own.
            record = await self.ctx.table.append(
                s,
                MessageReceived(sender=sender, text=text, message_id=message_id),
                durable=not woke,
            )
        if woke:
            try:  # the wake makes the message durable with its own first commit
                await self.runs.wake(
                    s,
                    "message",
                    {"sender": sender, "text": text[:1024], "seq": record["seq"]},
                    durable=False,
                )
            except BaseException:
                with contextlib.suppress(Exception):  # durable all the same, as before
                    await s.journal.flush()
                raise
        return {"session": to, "seq": record["seq"], "woke": woke}

    async def migrate(
        self, name: str, profile: str | None = None, to: str | None = None
    ) -> SessionDetail:
        s = self.ctx.table.get(name)
        if (profile is None) == (to is None):
            raise InvalidInput("say either --profile P or --to SOCKET")
        if profile is not None:
            if profile not in self.ctx.config.profiles:
                known = ", ".join(sorted(self.ctx.config.profiles))
                raise InvalidInput(
                    f"no runner profile {profile!r}; the daemon's profiles are {known} "
                    "([profiles.NAME] in its configuration; reload after adding one)"
                )
            async with s.lock:
                await self.ctx.table.append(
                    s, SessionMigrated(from_profile=s.journal.state.profile, to_profile=profile)
                )
            return detail(s)
        assert to is not None
        return await self._migrate_to(s, Path(to))

    async def _migrate_to(self, s: Session, socket: Path) -> SessionDetail:
        """Two phases (syscalls.handover): prepare there, commit here, then finish there."""
        lifecycle.check(s.name, s.state, "terminated", "migrate")  # fail fast
        async with self._without_run(s, "migrate"):
            lifecycle.check(s.name, s.state, "terminated", "migrate")
            h = await self.handover.send(s, socket)
        self._fill_slots()
        told = await self.handover.tell(h)  # else told again, with a growing delay
        answer = detail(s)
        answer["handover_finished"] = told
        return answer

    # --- context -------------------------------------------------------------------

    async def compact(self, name: str, keep: int = 4) -> SessionDetail:
        from sessiond.syscalls.compaction import (
            extractive_summary,
            plan,
            run_compact_command,
            still_valid,
        )

        s = self.ctx.table.get(name)
        async with s.lock:
            planned = await plan(s, keep=keep)
            if planned.command is None:
                await self.ctx.table.append(s, planned.event(extractive_summary(planned.older)))
                return detail(s)
        # The command runs without the lock: it may take a minute, and whatever it
        # does meanwhile (even a call back into this daemon) waits for nothing here.
        summary = await run_compact_command(self.runs.starter, s, planned)
        async with s.lock:
            if self.ctx.table.sessions.get(name) is not s:
                raise Refused(
                    f"session {name!r} was removed or replaced while its compaction command "
                    "ran; nothing was recorded"
                )
            await still_valid(s, planned)
            await self.ctx.table.append(s, planned.event(summary))
        return detail(s)

    # --- bundles -------------------------------------------------------------------

    async def export(self, name: str, path: str) -> Exported:
        s = self.ctx.table.get(name)
        # The log as it is at this instant (what comes while it is read is not in it),
        # read a slice at a time and packed in a thread: the loop goes on meanwhile.
        upto = s.journal.state.seq if s.journal_or_none is not None else None
        manifest = await export_paced(self.ctx.store, name, Path(path), upto=upto)
        return {"path": path, "events": manifest["events"]["count"], "session": name}

    async def import_(
        self, path: str, name: str | None = None, handover: dict[str, str] | None = None
    ) -> SessionDetail | Arrived:
        if handover is not None:  # the first phase of a migrate --to from another daemon
            return await self.handover.arrive(path, name, handover)
        journal = await import_session(
            self.ctx.store,
            Path(path),
            name=name,
            durability=self.ctx.config.durability,
            masks=lambda text: _masks(text, path),
        )
        spec_text = self.ctx.store.read_spec(journal.session)
        spec = parse_spec(spec_text, base=Path("/"), source=path) if spec_text else None
        if spec is not None and spec.name != journal.session:
            spec = spec.model_copy(update={"name": journal.session})
            self.ctx.store.write_spec(journal.session, spec_to_toml(spec))
        if spec is not None and spec.run is not None and spec.run.kind in AGENT_KINDS:
            # Another machine's session: its CLI session goes on from the transcript.
            await asyncio.to_thread(
                restore_transcript, self.ctx.store, self.ctx.config.state_dir, journal.session,
                spec.run.kind,
            )  # fmt: skip
        s = Session(journal.session, journal, spec, spec_text)
        self.ctx.table.adopt(s)
        asked = await self._ask_again(s)
        state = journal.state.state
        if asked and state in ("created", "ready", "running", "sleeping"):
            await self.ctx.table.append(
                s,
                LifecycleChanged.model_validate({"from": state, "to": "blocked", "reason": asked}),
            )
        elif state in ("running", "ready"):
            # It arrives not running: it runs here only after a wake and the gate.
            to = "sleeping" if spec is not None and spec.has_triggers else "created"
            await self.ctx.table.append(
                s,
                LifecycleChanged.model_validate(
                    {
                        "from": state,
                        "to": to,
                        "reason": "imported: not running; activate goes through the gate first",
                    }
                ),
            )
        if self.ctx.triggers is not None:
            self.ctx.triggers.rearm(s)
        return detail(s)

    async def _ask_again(self, s: Session) -> str | None:
        """An approval in a bundle was not given here: whoever wrote the bundle
        wrote its answers too (a program can craft one). Each call approved there
        and not run yet is asked again; the reason to block on, if one was."""
        asked: list[str] = []
        for call_id, approval in sorted(s.journal.state.approvals.items()):
            call = s.journal.state.calls.get(call_id)
            if approval.get("status") != "granted" or (call and call["stage"] != "approved"):
                continue
            await self.ctx.table.append(
                s,
                ApprovalRequested(
                    call=call_id, tool=approval["tool"], args_sha256=approval.get("args_sha256")
                ),
                correlation=call_id,
            )
            asked.append(f"{approval['tool']} [{call_id}]")
        if not asked:
            return None
        return (
            f"approval pending for {', '.join(asked)}: an approval that came with an "
            "imported bundle was not given here, so it is asked again"
        )


def _masks(spec_text: str | None, source: str) -> Redactor | None:
    """What a bundle's own spec masks: what its events and artifacts must not hold."""
    if not spec_text:
        return None
    try:  # a spec refused (BadSpec) is refused here, before the session is made
        spec = parse_spec(spec_text, base=Path("/"), source=source)
    except ValueError:
        return None  # refused as it is read next, as it always was
    return redactor(spec.redact)


def _last_said(transcript: list[TranscriptItem]) -> str:
    for item in reversed(transcript):
        if item["role"] in ("assistant", "tool"):
            return str(item["text"])
    return ""
