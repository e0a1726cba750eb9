"""Triggers: what wakes a sleeping session.

* ``cron`` and ``every``: timers on the daemon's clock. A timer never sleeps more
  than a minute before looking at the clock again, so a wall clock set back or
  forward, or a suspended machine, causes at most one run and a recomputed next
  fire — never a burst and never a hang. Cron fires missed while the daemon was
  down run once at start-up (``catch_up = "once"``); the last fire is taken from
  the session's own log (its last cron ``wake.requested``).
* ``watch`` and ``[bind]`` (dependency): one shared watchfiles watcher over every
  armed workspace routes each change to the sessions that watch it; each session
  debounces its own changes into one wake listing every changed path. A bound
  file wakes its session only when its content hash changed. A reconciliation
  scan catches what the kernel did not report (inotify overflow) and logs it.
* ``git``: a change under a repository's ``.git`` makes the daemon read the ref;
  if it moved and the diff from the last commit this session saw touches the
  trigger's paths, the session wakes with the commit range.
* ``message`` is ``sessionctl send``; ``manual`` is ``sessionctl activate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import structlog
import watchfiles

from sessiond.gitrefs import git, git_folder, head_ref, moved_forward, resolve
from sessiond.log.store.durable import write_durable
from sessiond.table.sessions import Session, file_hash
from sessiond.table.spec import (
    CronTriggerSpec,
    EveryTriggerSpec,
    GitTriggerSpec,
    SessionSpec,
    WatchTriggerSpec,
)
from sessiond.wake.cron import Cron

if TYPE_CHECKING:
    from sessiond.syscalls.kernel import Kernel

log = structlog.get_logger(__name__)

RECHECK = 60.0  # seconds: the longest a timer sleeps before reading the clock again
RECONCILE = 30.0  # seconds between reconciliation scans of watched paths
GIT_CURSOR = "git.cursor.json"  # per session: where each git trigger's scan resumes


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    """A glob as a regular expression: ``*`` and ``?`` stay inside one folder, ``**``
    crosses folders (``src/**`` is everything under src)."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def match(rel: str, patterns: list[str]) -> bool:
    """Glob match on a workspace-relative path; a pattern naming a folder covers it."""
    for pattern in patterns:
        if _glob(pattern).match(rel) or rel.startswith(pattern.rstrip("/") + "/"):
            return True
    return False


@dataclass
class Armed:
    """A session's live triggers."""

    session: Session
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    next_fires: dict[str, datetime] = field(default_factory=dict)  # trigger key -> next fire
    pending_paths: set[str] = field(default_factory=set)
    flush: asyncio.TimerHandle | None = None
    # repo:ref -> last commit seen; shared by every arming of the session (see arm)
    git_seen: dict[str, str] = field(default_factory=dict)
    scan: dict[str, tuple[int, int]] = field(default_factory=dict)  # reconciliation baseline


class Triggers:
    def __init__(self, kernel: Kernel, clock: Callable[[], float], poll_step_ms: int) -> None:
        self.kernel = kernel
        self.clock = clock  # seconds since the epoch (the daemon's clock)
        self.poll_step_ms = poll_step_ms
        self.armed: dict[str, Armed] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._stop_watch: asyncio.Event | None = None
        self._roots: frozenset[str] = frozenset()
        self._reconciler: asyncio.Task[None] | None = None
        self.started = False
        # Per session, kept across re-arming (every run's end re-arms): the commits
        # seen, and one git check at a time, so that wakes are recorded in commit
        # order and a check in flight is not repeated by the next arming.
        self._git_seen: dict[str, dict[str, str]] = {}
        self._git_locks: dict[str, asyncio.Lock] = {}

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    # --- arming ---------------------------------------------------------------------

    def arm_all(self) -> None:
        self.started = True
        for s in self.kernel.table:
            self.arm(s)
        self._restart_watcher()
        if self._reconciler is None:
            self._reconciler = asyncio.ensure_future(self._reconcile_loop())

    def arm(self, s: Session) -> None:
        """(Re)arm a session's triggers from its spec; disarm if it has none left."""
        self.disarm(s.name, restart=False)
        spec = s.spec
        if spec is None or not spec.has_triggers or s.journal is None or s.state == "terminated":
            return
        armed = Armed(s, git_seen=self._git_seen.setdefault(s.name, {}))
        self.armed[s.name] = armed
        for index, trig in enumerate(spec.trigger):
            key = f"{trig.type}#{index}"
            if isinstance(trig, CronTriggerSpec):
                self._arm_cron(armed, key, trig)
            elif isinstance(trig, EveryTriggerSpec):
                self._arm_every(armed, key, trig)
            elif isinstance(trig, GitTriggerSpec):
                self._arm_git(armed, trig)
        if armed.git_seen:  # commits made since the last scan (a restart) wake it now
            self._check_git(armed)
        self._baseline_scan(armed)

    def disarm(self, name: str, *, restart: bool = True) -> None:
        armed = self.armed.pop(name, None)
        if armed is None:
            return
        if armed.session.state == "terminated" or name not in self.kernel.table.sessions:
            self._git_seen.pop(name, None)
            self._git_locks.pop(name, None)
        for timer in armed.timers:
            timer.cancel()
        if armed.flush is not None:
            armed.flush.cancel()
        if restart:
            self._restart_watcher()

    def rearm(self, s: Session) -> None:
        if not self.started:
            return  # arm_all() arms everyone once, at start-up
        self.arm(s)
        self._restart_watcher()

    async def close(self) -> None:
        for name in list(self.armed):
            self.disarm(name, restart=False)
        if self._stop_watch is not None:
            self._stop_watch.set()
        for task in (self._watcher, self._reconciler):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def next_wake(self, s: Session) -> str | None:
        """For ps/show: the next time for cron and every, "on change of …" for the rest."""
        armed = self.armed.get(s.name)
        spec = s.spec
        if armed is None or spec is None:
            return None
        parts = []
        if armed.next_fires:
            soonest = min(armed.next_fires.values())
            parts.append(soonest.isoformat(timespec="seconds").replace("+00:00", "Z"))
        for trig in spec.trigger:
            if isinstance(trig, WatchTriggerSpec):
                parts.append("on change of " + " ".join(trig.paths))
            elif isinstance(trig, GitTriggerSpec):
                parts.append(f"on commit to {' '.join(trig.paths)}")
            elif trig.type == "message":
                parts.append("on message")
        if spec.bind.files:
            parts.append("on change of " + " ".join(spec.bind.files))
        return "; ".join(parts) or None

    # --- timers ---------------------------------------------------------------------

    def _schedule(self, armed: Armed, key: str, fire: datetime, fn: Callable[[], None]) -> None:
        armed.next_fires[key] = fire
        delay = min(max((fire - self.now()).total_seconds(), 0.0), RECHECK)
        armed.timers.append(asyncio.get_running_loop().call_later(delay, fn))

    def _last_wake(
        self,
        s: Session,
        trigger: str,
        which: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any] | None:
        """The newest wake of this kind (and, given ``which``, with these details)."""
        last = None
        for record in self.kernel.store.read(s.name):
            data = record["data"]
            if record["type"] != "wake.requested" or data["trigger"] != trigger:
                continue
            if which is None or which(data["details"]):
                last = record
        return last

    def _arm_cron(self, armed: Armed, key: str, trig: CronTriggerSpec) -> None:
        cron = Cron(trig.schedule, trig.timezone, trig.jitter)
        s = armed.session
        now = self.now()
        last = self._last_wake(s, "cron")
        if last is not None:
            details = last["data"]["details"]
            # a catch-up stands for every fire up to the moment it was made
            reference = datetime.fromisoformat(str(details.get("caught_up_to") or details["fire"]))
        else:
            created = s.j.state.created_at
            reference = datetime.fromisoformat(created.replace("Z", "+00:00")) if created else now
        missed = cron.first_missed(reference, now) if trig.catch_up == "once" else None
        if missed is not None:
            details = {
                "schedule": trig.schedule, "fire": missed.isoformat(), "catch_up": True,
                "caught_up_to": now.isoformat(),
            }  # fmt: skip
            self.kernel.spawn(self.kernel.wake(s, "cron", details))
        self._next_cron(armed, key, trig, cron, now)

    def _next_cron(
        self, armed: Armed, key: str, trig: CronTriggerSpec, cron: Cron, after: datetime
    ) -> None:
        fire = cron.next_after(after)
        if fire is None:
            armed.next_fires.pop(key, None)
            return
        if trig.jitter:
            fire += timedelta(seconds=(hash((key, fire)) % 1000) / 1000 * trig.jitter)

        def tick() -> None:
            if self.armed.get(armed.session.name) is not armed:
                return  # disarmed meanwhile
            now = self.now()
            if now >= fire:
                details = {"schedule": trig.schedule, "fire": fire.isoformat()}
                self.kernel.spawn(self.kernel.wake(armed.session, "cron", details))
                self._next_cron(armed, key, trig, cron, now)  # missed fires collapse into one
            elif fire - now > timedelta(days=400):
                self._next_cron(armed, key, trig, cron, now)  # the clock went back: recompute
            else:
                self._schedule(armed, key, fire, tick)

        self._schedule(armed, key, fire, tick)

    def _arm_every(self, armed: Armed, key: str, trig: EveryTriggerSpec) -> None:
        s = armed.session
        state = s.j.state
        anchor = (state.last_run or {}).get("ts") or state.created_at
        base = datetime.fromisoformat(anchor.replace("Z", "+00:00")) if anchor else self.now()
        fire = max(base + timedelta(seconds=trig.interval), self.now())

        def tick() -> None:
            if self.armed.get(s.name) is not armed:
                return
            now = self.now()
            if now >= fire or fire - now > timedelta(seconds=trig.interval * 2):
                self.kernel.spawn(self.kernel.wake(s, "every", {"interval": trig.interval}))
                # measured from the end of the run: re-armed when the run ends
            else:
                self._schedule(armed, key, fire, tick)

        self._schedule(armed, key, fire, tick)

    def run_ended(self, s: Session) -> None:
        """An ``every`` interval is measured from the end of the last run."""
        spec = s.spec
        if spec is not None and any(isinstance(t, EveryTriggerSpec) for t in spec.trigger):
            self.rearm(s)

    # --- git ------------------------------------------------------------------------

    def _ref(self, trig: GitTriggerSpec) -> str:
        if trig.ref:
            return trig.ref
        return head_ref(Path(trig.repo)) or "HEAD"

    # Where a git trigger's scan starts is durable, so that commits made while the
    # daemon was down still wake the session after a restart. A wake records its
    # range in the log; the cursor file records what the log cannot: the first
    # baseline and commits passed over because they touched no watched path. It
    # is stamped with the session's seq when written; a git wake in the log after
    # that seq wins over it.

    def _git_cursor_file(self, s: Session) -> Path:
        return Path(self.kernel.store.sessions_dir) / s.name / GIT_CURSOR

    def _read_git_cursor(self, s: Session) -> dict[str, Any]:
        try:
            found = orjson.loads(self._git_cursor_file(s).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return found if isinstance(found, dict) else {}

    def _save_git_cursor(self, armed: Armed) -> None:
        s = armed.session
        # Every wake already in the log is older than this seq; one still being
        # appended will be newer and win over the cursor (rescanning, never skipping).
        after = s.j.state.seq
        cursor = {key: {"commit": c, "after_seq": after} for key, c in armed.git_seen.items()}
        try:
            write_durable(self._git_cursor_file(s), orjson.dumps(cursor))
        except OSError as exc:  # the log's last wake still bounds what can be missed
            log.warning("git.cursor_unsaved", session=s.name, error=str(exc))

    def _arm_git(self, armed: Armed, trig: GitTriggerSpec) -> None:
        s = armed.session
        ref = self._ref(trig)
        key = f"{trig.repo}:{ref}"
        if key in armed.git_seen:
            return  # armed before: what this daemon has seen is newer than the log
        last = self._last_wake(s, "git", lambda d: f"{d.get('repo')}:{d.get('ref')}" == key)
        cursor = self._read_git_cursor(s).get(key)
        if isinstance(cursor, dict) and (last is None or last["seq"] <= cursor.get("after_seq", 0)):
            armed.git_seen[key] = str(cursor.get("commit") or "")
        elif last is not None:
            armed.git_seen[key] = str(last["data"]["details"]["to"])
        else:  # first arming: start from the tip now, and remember it
            armed.git_seen[key] = resolve(Path(trig.repo), ref) or ""
            if armed.git_seen[key]:
                self._save_git_cursor(armed)

    def _check_git(self, armed: Armed) -> None:
        """Look for new commits; the git processes run off the event loop."""
        self.kernel.spawn(self._check_git_now(armed))

    async def _check_git_now(self, armed: Armed) -> None:
        spec = armed.session.spec
        assert spec is not None
        async with self._git_locks.setdefault(armed.session.name, asyncio.Lock()):
            for trig in spec.trigger:
                if not isinstance(trig, GitTriggerSpec):
                    continue
                repo = Path(trig.repo)
                ref = self._ref(trig)
                key = f"{trig.repo}:{ref}"
                new = resolve(repo, ref)  # the ref's file: no process on the common path
                old = armed.git_seen.get(key, "")
                if not new or new == old:
                    continue
                armed.git_seen[key] = new
                try:
                    await self._git_moved(armed, trig, ref, old, new)
                except Exception:
                    # Not recorded (a full disk, a session held, an unreadable object):
                    # the move is looked at again by the next check, not forgotten.
                    armed.git_seen[key] = old
                    log.exception("git.check_failed", session=armed.session.name, to=new)

    async def _git_moved(
        self, armed: Armed, trig: GitTriggerSpec, ref: str, old: str, new: str
    ) -> None:
        forced, changed_all = await _git_range(Path(trig.repo), old, new)
        changed = [p for p in changed_all if match(p, trig.paths)]
        if not changed:
            log.info("git.ignored", session=armed.session.name, to=new, why="paths untouched")
            self._save_git_cursor(armed)
            return
        details = {
            "repo": trig.repo, "ref": ref, "from": old, "to": new,
            "range": f"{old}..{new}" if old else new, "forced": forced, "paths": changed,
        }  # fmt: skip
        await self.kernel.wake(armed.session, "git", details)

    # --- watch and dependency ---------------------------------------------------------

    def _roots_now(self) -> frozenset[str]:
        roots = set()
        for armed in self.armed.values():
            spec = armed.session.spec
            assert spec is not None
            if spec.bind.files or any(isinstance(t, WatchTriggerSpec) for t in spec.trigger):
                roots.add(str(spec.workspace))
            for trig in spec.trigger:
                if isinstance(trig, GitTriggerSpec):
                    roots.add(str(git_folder(Path(trig.repo))))
        return frozenset(r for r in roots if os.path.isdir(r))

    def _restart_watcher(self) -> None:
        roots = self._roots_now()
        if roots == self._roots and self._watcher is not None:
            return
        if self._stop_watch is not None:
            self._stop_watch.set()
        self._roots = roots
        if not roots:
            self._watcher = None
            return
        self._stop_watch = asyncio.Event()
        self._watcher = asyncio.ensure_future(self._watch(roots, self._stop_watch))

    async def _watch(self, roots: frozenset[str], stop: asyncio.Event) -> None:
        log.info("watch.started", roots=sorted(roots), step_ms=self.poll_step_ms)
        try:
            async for changes in watchfiles.awatch(
                *roots, watch_filter=None, step=self.poll_step_ms, debounce=1_600,
                stop_event=stop, ignore_permission_denied=True,
            ):  # fmt: skip
                self.route({path for _, path in changes})
        except Exception:
            log.exception("watch.failed")

    def route(self, paths: set[str]) -> None:
        """Send changed absolute paths to the sessions that watch them."""
        for armed in list(self.armed.values()):
            spec = armed.session.spec
            assert spec is not None
            workspace = str(spec.workspace).rstrip("/") + "/"
            git_dirs = [
                str(git_folder(Path(t.repo))) + "/"
                for t in spec.trigger
                if isinstance(t, GitTriggerSpec)
            ]
            if any(p.startswith(g) or p + "/" == g for p in paths for g in git_dirs):
                self._check_git(armed)
            hits = {p[len(workspace) :] for p in paths if p.startswith(workspace)}
            hits = {h for h in hits if not h.startswith(".git/") and h != ".git"}
            wanted = {h for h in hits if self._watched(spec, h)}
            if wanted:
                for rel in wanted:  # seen by the watcher: the reconciliation need not report it
                    try:
                        st = (spec.workspace / rel).stat()
                        armed.scan[rel] = (st.st_mtime_ns, st.st_size)
                    except OSError:
                        armed.scan.pop(rel, None)
                self._collect(armed, wanted)

    @staticmethod
    def _watched(spec: SessionSpec, rel: str) -> bool:
        if rel in spec.bind.files:
            return True
        for trig in spec.trigger:
            if (
                isinstance(trig, WatchTriggerSpec)
                and match(rel, trig.paths)
                and not match(rel, trig.exclude)
            ):
                return True
        return False

    def _collect(self, armed: Armed, paths: set[str]) -> None:
        armed.pending_paths |= paths
        if armed.flush is not None:
            return  # one wake per debounce window, carrying every path
        spec = armed.session.spec
        assert spec is not None
        debounce = min(
            (t.debounce for t in spec.trigger if isinstance(t, WatchTriggerSpec)), default=0.2
        )
        # The watcher already grouped changes for one polling step before reporting
        # them: that time counts towards the window.
        window = max(debounce - self.poll_step_ms / 1000, 0.0)
        armed.flush = asyncio.get_running_loop().call_later(window, self._flush, armed)

    def _flush(self, armed: Armed) -> None:
        armed.flush = None
        paths, armed.pending_paths = armed.pending_paths, set()
        s = armed.session
        spec = s.spec
        assert spec is not None
        bound = s.j.state.bound
        changed_bound = sorted(
            p
            for p in paths
            if p in spec.bind.files and file_hash(spec.workspace / p) != bound.get(p)
        )
        watched = sorted(
            p for p in paths if any(
                isinstance(t, WatchTriggerSpec) and match(p, t.paths) and not match(p, t.exclude)
                for t in spec.trigger
            )
        )  # fmt: skip
        if watched:
            self.kernel.spawn(
                self.kernel.wake(
                    s, "watch", {"paths": watched}, frozenset(watched) | frozenset(changed_bound)
                )
            )
        elif changed_bound:
            self.kernel.spawn(
                self.kernel.wake(
                    s, "dependency", {"paths": changed_bound}, frozenset(changed_bound)
                )
            )

    # --- reconciliation ---------------------------------------------------------------

    def _scan(self, spec: SessionSpec) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        base = spec.workspace
        patterns = list(spec.bind.files)
        for trig in spec.trigger:
            if isinstance(trig, WatchTriggerSpec):
                patterns += trig.paths
        for pattern in patterns:
            for path in base.glob(pattern):
                if path.is_file():
                    rel = str(path.relative_to(base))
                    st = path.stat()
                    found[rel] = (st.st_mtime_ns, st.st_size)
        return found

    def _baseline_scan(self, armed: Armed) -> None:
        spec = armed.session.spec
        assert spec is not None
        if spec.bind.files or any(isinstance(t, WatchTriggerSpec) for t in spec.trigger):
            armed.scan = self._scan(spec)

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE)
            for armed in list(self.armed.values()):
                spec = armed.session.spec
                if spec is None or (not armed.scan and not spec.bind.files):
                    continue
                now = await asyncio.to_thread(self._scan, spec)
                missed = {p for p, v in now.items() if armed.scan.get(p) != v}
                missed |= set(armed.scan) - set(now)
                armed.scan = now
                missed = {p for p in missed if self._watched(spec, p)} - armed.pending_paths
                if missed:
                    log.warning(
                        "watch.reconciled", session=armed.session.name, missed=sorted(missed)
                    )
                    self._collect(armed, missed)


def wall_clock(offset: float) -> Callable[[], float]:
    return lambda: time.time() + offset


# paths as they are (not octal-quoted), as the loose-object diff gives them
_RAW = ("-c", "core.quotepath=off")


async def _git_range(repo: Path, old: str, new: str) -> tuple[bool, list[str]]:
    """(was the ref moved other than forward, the paths changed from old to new).

    ``merge-base`` says whether ``old`` is an ancestor of ``new``; ``diff old...new``
    diffs from where the two met, which is ``old`` itself for a move forward and
    the fork point after a rebase, a reset or a force push. The two git processes
    run side by side, off the event loop. Without a common commit: the paths of
    ``new`` itself."""
    if not old:
        names = await asyncio.to_thread(
            git, repo, *_RAW, "show", "--pretty=format:", "--name-only", new
        )
        return False, [p for p in (names or "").splitlines() if p]
    forward = await asyncio.to_thread(moved_forward, repo, old, new)  # new commits: no git
    if forward is not None:
        return False, forward
    # A rename counts as both of its paths, as the loose-object diff counts it.
    base, names = await asyncio.gather(
        asyncio.to_thread(git, repo, "merge-base", old, new),
        asyncio.to_thread(
            git, repo, *_RAW, "diff", "--no-renames", "--name-only", f"{old}...{new}"
        ),
    )
    if base is None:  # unrelated histories
        names = await asyncio.to_thread(
            git, repo, *_RAW, "show", "--pretty=format:", "--name-only", new
        )
    return base != old, [p for p in (names or "").splitlines() if p]
