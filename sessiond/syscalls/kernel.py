"""The syscalls: what each `sessionctl` command does to the process table.

Every method here is one syscall of DESIGN.md section 3. Each appends its events
and has the visible effect the design names. The RPC server (sessiond.ipc.server)
only decodes requests and calls these; tests may call them directly.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import structlog

from sessiond import __version__
from sessiond.codec import rfc3339
from sessiond.config import DaemonConfig
from sessiond.errors import AlreadyExists, InvalidInput, Refused
from sessiond.log.bundle import export_session, import_session
from sessiond.log.event_data import (
    ApprovalDenied,
    ApprovalGranted,
    ArtifactRef,
    BindingObserved,
    LifecycleChanged,
    MessageReceived,
    ObservationProjected,
    RecoveryResolved,
    SessionCreated,
    SessionMerged,
    SessionMigrated,
    WakeRequested,
)
from sessiond.log.lineage import fork as fork_log
from sessiond.log.store.base import Draft, Record
from sessiond.runs.flow import Runs, close_cut_off, workspace_hasher
from sessiond.runs.sdk_calls import RunGrant, SdkCalls
from sessiond.syscalls.views import detail, gate_report, replay_view
from sessiond.table import lifecycle
from sessiond.table.scheduler import Scheduler
from sessiond.table.sessions import Session, Table, file_hash
from sessiond.table.spec import SessionSpec, parse_spec, spec_to_toml

log = structlog.get_logger(__name__)


class Kernel(SdkCalls, Runs):
    def __init__(self, config: DaemonConfig, table: Table, env: dict[str, str]) -> None:
        self.config = config
        self.table = table
        self.store = table.store
        self.env = env
        self.runtime_dir = config.state_dir / "runtime"
        self.retry_timers: dict[str, asyncio.TimerHandle] = {}
        self.background: set[asyncio.Task[Any]] = set()
        self.tokens: dict[str, RunGrant] = {}
        self.triggers: Any = None  # sessiond.wake.triggers.Triggers, set by the daemon
        self.stopping = False  # set at shutdown: nothing new starts
        self.scheduler = Scheduler(config.max_running, config.max_running_per_agent, config.aging)

    # --- helpers -----------------------------------------------------------------------

    async def _transition(
        self,
        s: Session,
        to: str,
        *,
        why: str,
        reason: str = "",
        outcome: str | None = None,
        causation: str | None = None,
        durable: bool = True,
    ) -> Record:
        event = lifecycle.change(s.name, s.state, to, why=why, reason=reason, outcome=outcome)
        record = await self.table.append(s, event, causation=causation, durable=durable)
        log.info("lifecycle", session=s.name, to=to, reason=reason)
        if to != "ready":
            self.scheduler.queue.pop(s.name, None)
        if to == "terminated" and self.triggers is not None:
            self.triggers.disarm(s.name)
        return record

    def _usable(self, name: str) -> Session:
        """The session, refused with the reason when its log cannot be used (corrupt,
        a symlink planted in the state dir): its state reads "blocked", and "approve or
        resolve it" would send the operator the wrong way."""
        s = self.table.get(name)
        _ = s.j  # raises Refused naming why there is no log
        return s

    def _now(self) -> int:
        return self.store.clock()

    async def _bind_hashes(self, s: Session) -> None:
        spec = s.spec
        if spec is None or not spec.bind.files:
            return
        hashes = {f: file_hash(spec.workspace / f) for f in spec.bind.files}
        await self.table.append(s, BindingObserved(hashes=hashes))

    # --- inspection ------------------------------------------------------------------

    async def ping(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "protocol": 1,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.table.started, 3),
            "sessions": len(self.table),
            "state_dir": str(self.config.state_dir),
        }

    async def ps(self) -> list[dict[str, Any]]:
        from sessiond.table.sessions import summary

        fn = self.table.next_wake_fn
        return [summary(s, fn) for s in sorted(self.table, key=lambda s: s.name)]

    async def show(self, name: str) -> dict[str, Any]:
        return detail(self.table.get(name))

    async def log_(
        self, name: str, since: int = 1, types: list[str] | None = None, limit: int = 0
    ) -> list[Record]:
        self.table.get(name)
        wanted = set(types or ())
        records = [
            r for r in self.store.read(name, since=since) if not wanted or r["type"] in wanted
        ]
        return records[-limit:] if limit else records

    async def replay(self, name: str, upto: int | None = None, view: str = "state") -> Any:
        self.table.get(name)
        return replay_view(name, self.store.read(name, upto=upto), view)

    async def gate(self, name: str) -> dict[str, Any]:
        s = self.table.get(name)
        return gate_report(s, self.now(), self.store.artifacts(name).has)

    # --- creation ----------------------------------------------------------------------

    async def create(self, spec: str, base: str, source: str = "spec") -> dict[str, Any]:
        parsed = parse_spec(spec, base=Path(base), source=source)
        await self._create(parsed)
        return detail(self.table.get(parsed.name))

    async def _create(self, spec: SessionSpec) -> Session:
        check_environment(spec)
        if spec.name in self.table.sessions:
            raise AlreadyExists(
                f"session {spec.name!r} exists already; pick another name or cancel it first"
            )
        text = spec_to_toml(spec)
        new_log = await self.store.create(spec.name, spec=text, durability=self.config.durability)
        await new_log.close()
        s = await self.table.open_session(spec.name)
        self.table.adopt(s)
        await self.table.append(
            s,
            SessionCreated(
                name=spec.name,
                goal=spec.goal,
                description=spec.description,
                agent=spec.agent,
                priority=spec.priority,
                labels=spec.labels,
                profile=spec.run.profile if spec.run else "default",
                spec=spec.model_dump(mode="json"),
            ),
        )
        await self._bind_hashes(s)
        if spec.has_triggers:
            await self._transition(s, "sleeping", why="arm", reason="armed: waits for its triggers")
        log.info("session.created", session=spec.name)
        if self.triggers is not None:
            self.triggers.rearm(s)
        return s

    # --- running ----------------------------------------------------------------------

    async def activate(self, name: str) -> dict[str, Any]:
        s = self._usable(name)
        async with s.lock:
            state = s.state
            if state == "running":
                raise Refused(f"session {name!r} is running already (pid {s.run and s.run.pid})")
            if state in ("suspended", "blocked"):
                lifecycle.check(name, state, "ready", "activate")
                hint = "resume it" if state == "suspended" else "approve or resolve it"
                raise Refused(f"cannot activate session {name!r}: it is {state}; {hint} first")
            lifecycle.check(name, state, "ready", "activate")
            if s.spec is None or s.spec.run is None:
                raise Refused(
                    f"session {name!r} has no [run] program to start; it can still be sent "
                    "messages, forked, merged and compacted"
                )
            wake = await self.table.append(s, WakeRequested(trigger="manual"))
            await self.proceed(s, wake)
        return detail(s)

    # --- lifecycle syscalls -----------------------------------------------------------------

    async def suspend(self, name: str) -> dict[str, Any]:
        s = self.table.get(name)
        if s.state == "running":
            await self.stop_run(s, "suspend")
            return detail(s)
        async with s.lock:
            await self._transition(s, "suspended", why="suspend", reason="suspended by request")
        return detail(s)

    async def resume(self, name: str) -> dict[str, Any]:
        s = self._usable(name)
        async with s.lock:
            if s.state != "suspended":
                raise Refused(f"cannot resume session {name!r}: it is {s.state}, not suspended")
            pending = s.j.state.pending_wakes
            await self._transition(s, "sleeping", why="resume", reason="resumed")
            if pending and s.spec is not None and s.spec.run is not None:
                await self.proceed(s, None)
        return detail(s)

    async def interrupt(self, name: str) -> dict[str, Any]:
        s = self.table.get(name)
        if s.state != "running" or s.run is None:
            raise Refused(
                f"cannot interrupt session {name!r}: it is {s.state}, and only a running "
                "session can be interrupted"
            )
        await self.stop_run(s, "interrupt")
        return detail(s)

    async def cancel(self, name: str) -> dict[str, Any]:
        s = self.table.get(name)
        if s.state == "running" and s.run is not None:
            await self.stop_run(s, "cancel")
            return detail(s)
        async with s.lock:
            await self._transition(
                s, "terminated", why="cancel", reason="cancelled", outcome="cancelled"
            )
        return detail(s)

    # --- lineage --------------------------------------------------------------------

    async def fork(
        self, name: str, new: str, at: int | None = None, with_triggers: bool = False
    ) -> dict[str, Any]:
        parent = self.table.get(name)
        if new in self.table.sessions:
            raise AlreadyExists(f"session {new!r} exists already; pick another name")
        async with parent.lock:
            child_journal = await fork_log(
                self.store,
                parent.j,
                new,
                at_seq=at,
                with_triggers=with_triggers,
                durability=self.config.durability,
            )
        spec = None
        if parent.spec is not None:
            update: dict[str, Any] = {"name": new}
            if not with_triggers:
                update["trigger"] = []
                update["bind"] = parent.spec.bind.model_copy(update={"files": []})
            spec = parent.spec.model_copy(update=update)
            self.store.write_spec(new, spec_to_toml(spec))
        child = Session(new, child_journal, spec, None)
        self.table.adopt(child)
        armed = spec is not None and spec.has_triggers
        inherited = child_journal.state.state
        await self.table.append(
            child,
            LifecycleChanged.model_validate(
                {
                    "from": inherited,
                    "to": "sleeping" if armed else "created",
                    "reason": f"forked from {name} at seq {child_journal.state.fork_seq}",
                }
            ),
        )
        if armed and self.triggers is not None:
            self.triggers.rearm(child)
        return detail(child)

    async def merge(
        self, child_name: str, into: str | None = None, summary: str | None = None
    ) -> dict[str, Any]:
        child = self.table.get(child_name)
        target = into or child.j.state.parent
        if target is None:
            raise InvalidInput(
                f"session {child_name!r} has no parent; say which session to merge it into "
                "with --into"
            )
        parent = self.table.get(target)
        if parent.name == child.name:
            raise InvalidInput("a session cannot be merged into itself")
        lifecycle.check(child.name, child.state, "terminated", "merge")
        if parent.state == "terminated":
            raise Refused(f"cannot merge into session {parent.name!r}: it is terminated")
        if child.state == "running":
            await self.stop_run(child, "merge")
        cs = child.j.state
        text = summary or (cs.last_observation or {}).get("text") or _last_said(cs.transcript)
        text = text or f"{child.name} finished at seq {cs.seq}"
        refs = list(cs.live_artifacts().values())
        source, dest = self.store.artifacts(child.name), self.store.artifacts(parent.name)
        for ref in refs:
            dest.put(source.get(ref["ref"]), ref["name"], ref["media_type"])
        async with parent.lock:
            await self.table.append(
                parent,
                SessionMerged(
                    child=child.name,
                    summary=text,
                    artifacts=tuple(ArtifactRef.model_validate(r) for r in refs),
                    child_seq=cs.seq,
                ),
            )
        async with child.lock:
            await self._transition(
                child,
                "terminated",
                why="merge",
                reason=f"merged into {parent.name}",
                outcome="merged",
            )
        return {"parent": detail(parent), "child": detail(child)}

    async def send(self, to: str, text: str, sender: str = "sessionctl") -> dict[str, Any]:
        s = self.table.get(to)
        if s.state == "terminated":
            raise Refused(f"cannot send to session {to!r}: it is terminated")
        async with s.lock:
            record = await self.table.append(s, MessageReceived(sender=sender, text=text))
        woke = False
        if s.spec is not None and any(t.type == "message" for t in s.spec.trigger):
            await self.wake(
                s, "message", {"sender": sender, "text": text[:1024], "seq": record["seq"]}
            )
            woke = True
        return {"session": to, "seq": record["seq"], "woke": woke}

    async def migrate(
        self, name: str, profile: str | None = None, to: str | None = None
    ) -> dict[str, Any]:
        s = self.table.get(name)
        if (profile is None) == (to is None):
            raise InvalidInput("say either --profile P or --to SOCKET")
        if profile is not None:
            if profile not in self.config.profiles:
                known = ", ".join(sorted(self.config.profiles))
                raise InvalidInput(f"no runner profile {profile!r}; the daemon has {known}")
            async with s.lock:
                await self.table.append(
                    s, SessionMigrated(from_profile=s.j.state.profile, to_profile=profile)
                )
            return detail(s)
        assert to is not None
        return await self._migrate_to(s, Path(to))

    async def _migrate_to(self, s: Session, socket: Path) -> dict[str, Any]:
        from sessiond.wire import RemoteError, call_async

        lifecycle.check(s.name, s.state, "terminated", "migrate")
        if s.state == "running":
            await self.stop_run(s, "migrate")
        outbox = self.config.state_dir / "outbox"
        outbox.mkdir(mode=0o700, exist_ok=True)
        bundle = outbox / f"{s.name}.bundle"
        async with s.lock:
            export_session(self.store, s.name, bundle)
            try:
                try:
                    await call_async(socket, "import", {"path": str(bundle), "name": s.name})
                except OSError as exc:
                    raise Refused(
                        f"cannot reach the daemon at {socket}: {exc.strerror}; is it running?"
                    ) from exc
                except RemoteError as exc:
                    raise Refused(
                        f"the daemon at {socket} did not take session {s.name!r}: {exc.message}"
                    ) from exc
            finally:
                bundle.unlink(missing_ok=True)
            await self.table.append(s, SessionMigrated(to=str(socket)))
            await self._transition(
                s, "terminated", why="migrate", reason=f"migrated to {socket}", outcome="migrated"
            )
        return detail(s)

    # --- context -------------------------------------------------------------------

    async def compact(self, name: str, keep: int = 4) -> dict[str, Any]:
        from sessiond.syscalls.compaction import compact

        s = self.table.get(name)
        async with s.lock:
            event = await compact(s, keep=keep)
            await self.table.append(s, event)
        return detail(s)

    # --- approvals -----------------------------------------------------------------

    async def approve(self, name: str, call: str | None = None, by: str = "") -> dict[str, Any]:
        s = self.table.get(name)
        async with s.lock:
            approval = _pending(s, call)
            ttl = s.spec.policy.approval_ttl if s.spec else 3600.0
            expires = rfc3339(self._now() + int(ttl * 1e9))
            await self.table.append(
                s,
                ApprovalGranted(
                    call=approval["call"],
                    tool=approval["tool"],
                    args_sha256=approval.get("args_sha256"),
                    by=by,
                    expires_at=expires,
                ),
                correlation=approval["call"],
            )
            if s.state == "blocked" and not s.j.state.pending_approvals():
                await self._transition(s, "sleeping", why="approve", reason="approved")
        if s.state == "sleeping":
            await self.wake(s, "approval", {"call": approval["call"], "answer": "granted"})
        return detail(s)

    async def deny(
        self, name: str, call: str | None = None, by: str = "", reason: str = ""
    ) -> dict[str, Any]:
        s = self.table.get(name)
        async with s.lock:
            approval = _pending(s, call)
            await self.table.append(
                s,
                ApprovalDenied(call=approval["call"], tool=approval["tool"], by=by, reason=reason),
                correlation=approval["call"],
            )
            if s.state == "blocked" and not s.j.state.pending_approvals():
                await self._transition(s, "sleeping", why="deny", reason="approval denied")
        return detail(s)

    # --- recovery ------------------------------------------------------------------

    async def resolve(self, name: str, option: str, by: str = "") -> dict[str, Any]:
        """Apply a recovery option to a blocked session, then gate it again.

        ``rerun``: run the half-finished step again (it is recorded as cut off);
        ``discard``: drop the pending steps, recorded as abandoned; ``accept``:
        accept the workspace as it is now (its hashes are recorded).
        """
        s = self.table.get(name)
        async with s.lock:
            if s.state != "blocked":
                raise Refused(
                    f"cannot resolve session {name!r}: it is {s.state}; resolve is for a blocked "
                    "session ('sessionctl show' gives the reason it is blocked)"
                )
            state = s.j.state
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
            first = next(iter(sorted(open_calls)), None)
            for call_id, call in sorted(open_calls.items()):
                tool = call["tool"]
                if option == "discard":
                    text = f"{tool} was abandoned by {by or 'a person'}; it did not complete"
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
            drafts.append(Draft(RecoveryResolved(option=option, call=first, hashes=hashes, by=by)))
            await self.table.append_many(s, drafts)
            spec = s.spec
            if (
                option != "rerun"
                and cut_off_command
                and spec is not None
                and spec.run is not None
                and spec.run.kind == "command"
                and not state.pending_wakes
            ):
                # A command run is one tool call. Its program was started for every
                # wake there was (none is left), so an accepted or discarded call
                # ends that run: running the program again would repeat the very
                # step the person chose not to repeat. The session rests instead.
                # Accepted: its work stands, so the session ends the way a finished
                # run ends it. Discarded: nothing is done, so it waits for a wake.
                reason = f"resolved: --{option}; the cut-off run is not repeated"
                if option == "accept" and not spec.has_triggers:
                    await self._transition(
                        s, "terminated", why="resolve", reason=reason, outcome="completed"
                    )
                else:
                    await self._transition(s, "sleeping", why="resolve", reason=reason)
                return detail(s)
            await self._transition(s, "sleeping", why="resolve", reason=f"resolved: --{option}")
            cause = await self.table.append(
                s, WakeRequested(trigger="resolve", details={"option": option})
            )
            await self.proceed(s, cause)
        return detail(s)

    # --- bundles -------------------------------------------------------------------

    async def export(self, name: str, path: str) -> dict[str, Any]:
        self.table.get(name)
        manifest = export_session(self.store, name, Path(path))
        return {"path": path, "events": manifest["events"]["count"], "session": name}

    async def import_(self, path: str, name: str | None = None) -> dict[str, Any]:
        journal = await import_session(
            self.store, Path(path), name=name, durability=self.config.durability
        )
        spec_text = self.store.read_spec(journal.session)
        spec = parse_spec(spec_text, base=Path("/"), source=path) if spec_text else None
        if spec is not None and spec.name != journal.session:
            spec = spec.model_copy(update={"name": journal.session})
            self.store.write_spec(journal.session, spec_to_toml(spec))
        s = Session(journal.session, journal, spec, spec_text)
        self.table.adopt(s)
        state = journal.state.state
        if state in ("running", "ready"):
            # It arrives not running: it runs here only after a wake and the gate.
            to = "sleeping" if spec is not None and spec.has_triggers else "created"
            await self.table.append(
                s,
                LifecycleChanged.model_validate(
                    {
                        "from": state,
                        "to": to,
                        "reason": "imported: not running; activate goes through the gate first",
                    }
                ),
            )
        if self.triggers is not None:
            self.triggers.rearm(s)
        return detail(s)


def check_environment(spec: SessionSpec) -> None:
    """What a spec names outside itself must exist: the workspace, and every git
    trigger's repository. (Watch paths may appear later: the workspace is watched,
    and a watch starts matching once its path exists.)"""
    from sessiond.gitrefs import git
    from sessiond.table.spec import BadSpec, GitTriggerSpec

    if spec.run is not None and not Path(spec.run.cwd).is_dir():
        raise BadSpec(f"{spec.name}: run.cwd: {spec.run.cwd!r} is not a folder")
    for index, trig in enumerate(spec.trigger):
        if (
            isinstance(trig, GitTriggerSpec)
            and git(Path(trig.repo), "rev-parse", "--git-dir") is None
        ):
            raise BadSpec(
                f"{spec.name}: trigger[{index}].repo: {trig.repo!r} is not a git repository "
                "(create it with 'git init', or point repo at one)"
            )


def _pending(s: Session, call: str | None) -> dict[str, Any]:
    pending = s.j.state.pending_approvals()
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


def _last_said(transcript: list[dict[str, Any]]) -> str:
    for item in reversed(transcript):
        if item["role"] in ("assistant", "tool"):
            return str(item["text"])
    return ""
