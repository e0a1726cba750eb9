"""``watch`` and ``[bind]`` (dependency): changed files wake the sessions that watch them.

One watchfiles watcher over every armed workspace (and every git trigger's
``.git`` folder) routes each change to the sessions that watch it; each session
debounces its own changes into one wake listing every changed path. A bound
file wakes its session only when its content hash changed. A reported path
counts only if its look moved (sessiond.wake.looks: an attribute alone is no
change).

No change is lost to a watcher not in place yet: a new one (its roots changed)
scans the folders new to it once its inotify watches exist, and the one it
replaces reports until then (and a moment after, what it held). A
reconciliation scan every 30 s catches what the kernel did not report (inotify
overflow, another machine's writes on a shared folder) and logs it.

Separate from the timers and the git trigger because it owns the file system
side: the watcher tasks, the routing of paths, the debounce and the scans. A
change under a ``.git`` folder is handed to the git trigger (``check_git``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from sessiond.table.sessions import file_hash
from sessiond.table.spec import SessionSpec, WatchTriggerSpec
from sessiond.wake.armed import Armed, Look
from sessiond.wake.host import WakeHost
from sessiond.wake.looks import (
    git_dirs,
    inside,
    look,
    scan,
    watch_matches,
    watched,
    watches_files,
)

log = structlog.get_logger(__name__)

RECONCILE = 30.0  # seconds between reconciliation scans of watched paths
DEBOUNCE_MS = 1_600  # watchfiles' longest grouping of changes before it reports them

T = TypeVar("T")


@dataclass(eq=False)
class _Watch:
    """One watchfiles watcher: its roots, and the event that ends it. ``lenient``:
    it passes over the folders it may not watch (watchfiles then passes over every
    error, the user's limit of inotify watches met too, silently)."""

    roots: frozenset[str]
    lenient: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    error: Exception | None = None  # why it could not start


def _watch_set(spec: SessionSpec) -> tuple[object, ...]:
    """What decides which paths a session watches (its looks hold for the same set)."""
    watches = [(t.paths, t.exclude) for t in spec.trigger if isinstance(t, WatchTriggerSpec)]
    return (spec.workspace, spec.bind.files, watches)


class Watcher:
    """The one watcher task, the routing of its changes, the debounce of each
    session's changes and the reconciliation scans.

    ``armed`` is the coordinator's table of armed sessions; the watched roots
    follow it (``restart`` after it changed). ``hold`` is the tests' hold point
    before a watcher is built (``watch-arm``).
    """

    def __init__(
        self,
        host: WakeHost,
        poll_step_ms: int,
        armed: dict[str, Armed],
        check_git: Callable[[Armed], None],
        hold: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.host = host
        self.poll_step_ms = poll_step_ms
        self.armed = armed
        self.check_git = check_git
        self.hold = hold
        # The watcher that reports changes now, and the one being built to replace it
        # (its roots changed). The old one is ended only once the new one watches, so
        # that a root in both is never unwatched for a moment.
        self._live: _Watch | None = None
        self._next: _Watch | None = None
        # replaced watchers, each ended once it has reported what it saw last
        self._retiring: dict[_Watch, asyncio.TimerHandle] = {}
        self._deferred = False  # a restart waits for the retiring watcher's end
        # ended watchers whose inotify watches a rebuild waits to be given back (_failed)
        self._releasing: asyncio.Task[None] | None = None
        self._scanning: list[int] = []  # when each scan in a thread began (monotonic ns)
        self._reconciler: asyncio.Task[None] | None = None

    # --- the watcher task -------------------------------------------------------------

    def _roots_now(self) -> frozenset[str]:
        roots = set()
        for armed in self.armed.values():
            spec = armed.session.spec
            assert spec is not None
            if watches_files(spec):
                roots.add(str(spec.workspace))
            roots.update(str(g) for g in git_dirs(spec))
        return frozenset(r for r in roots if os.path.isdir(r))

    def restart(self) -> None:
        """Watch the roots the armed sessions need now (a no-op if they are the same)."""
        if self._retiring or self._releasing is not None:
            # One replaced a moment ago still reports what it saw last: the next one
            # is built when it ends (and scans the folders new to it), so that a burst
            # of armings holds three watchers (their inotify instances and watches,
            # their threads) at most, not one for each arming.
            self._deferred = True
            return
        roots = self._roots_now()
        newest = self._next or self._live
        if newest is not None and newest.roots == roots:
            return
        if self._next is not None:  # superseded before it watched: nothing rests on it
            self._end(self._next)
            self._next = None
        if not roots:
            if self._live is not None:
                self._end(self._live)
                self._live = None
            return
        # watchfiles loads with the first root watched, not at the daemon's start; here,
        # before the request that armed it is answered, so that the watch begins as
        # soon after it as when it was imported at the start
        import watchfiles  # noqa: F401

        self._build(roots, lenient=False)

    def _build(self, roots: frozenset[str], *, lenient: bool) -> None:
        self._next = _Watch(roots, lenient)
        self._next.task = asyncio.ensure_future(self._watch(self._next))

    @staticmethod
    def _end(w: _Watch) -> None:
        w.stop.set()
        if w.task is not None:
            w.task.cancel()

    def start_reconciler(self) -> None:
        if self._reconciler is None:
            self._reconciler = asyncio.ensure_future(self._reconcile_loop())

    async def close(self) -> None:
        watches = [w for w in (self._live, self._next) if w is not None]
        for w, timer in self._retiring.items():
            timer.cancel()
            watches.append(w)
        self._live = self._next = None
        self._retiring, self._deferred = {}, False
        if self._releasing is not None:
            self._releasing.cancel()
            self._releasing = None
        for w in watches:
            w.stop.set()
        tasks = [w.task for w in watches] + [self._reconciler]
        for task in tasks:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _watch(self, w: _Watch) -> None:
        import watchfiles  # imported already (restart)

        if self.hold is not None:
            await self.hold("watch-arm", "")
        changes = watchfiles.awatch(
            *w.roots, watch_filter=None, step=self.poll_step_ms, debounce=DEBOUNCE_MS,
            stop_event=w.stop, ignore_permission_denied=w.lenient,
        )  # fmt: skip
        # awatch builds its inotify watches synchronously when first iterated, before
        # its first wait: a callback queued now runs once they are in place.
        asyncio.get_running_loop().call_soon(self._watching, w)
        log.info("watch.started", roots=sorted(w.roots), step_ms=self.poll_step_ms)
        try:
            async for batch in changes:
                self.route({path for _, path in batch})
        except Exception as exc:
            if w is self._next:
                w.error = exc  # it could not start: _watching decides what next
            else:
                log.exception("watch.failed")

    def _watching(self, w: _Watch) -> None:
        """``w`` watches its roots now: it replaces the live watcher, and what changed
        in a root new to it before it watched is found by a scan."""
        if w is not self._next:
            return  # superseded (ended by restart) or closed
        if w.task is not None and w.task.done():
            self._next = None
            self._failed(w)
            return
        before = self._live.roots if self._live is not None else frozenset()
        if self._live is not None:
            self._retire(self._live)
        self._live, self._next = w, None
        fresh = w.roots - before
        behind = []
        for armed in list(self.armed.values()):
            spec = armed.session.spec
            assert spec is not None
            # Armed before this watch began: a change made between its arming (the
            # request answered) and now was reported by no watcher.
            if any(str(g) in fresh for g in git_dirs(spec)):
                self.check_git(armed)
            if watches_files(spec) and str(spec.workspace) in fresh:
                behind.append(armed)
        if behind:
            self.host.spawn(self._catch_up(behind))

    def _failed(self, w: _Watch) -> None:
        """``w`` could not start. Beside the live watcher (and one retiring), the
        inotify watches of the roots they share are held twice, which the user's
        limit may not allow: they end, and it is built again alone (every root is
        new to it then, and scanned). Else, or alone, it is built again passing over
        what it cannot watch (a folder it may not read). Else the live one goes on."""
        denied = isinstance(w.error, PermissionError)
        (log.info if denied and not w.lenient else log.warning)(
            "watch.failed", roots=sorted(w.roots), lenient=w.lenient, error=str(w.error)
        )
        crowded = self._live is not None or bool(self._retiring)
        if isinstance(w.error, OSError) and not denied and crowded:
            olds = [*self._retiring, *([self._live] if self._live is not None else [])]
            for old in olds:
                self._end(old)
            for timer in self._retiring.values():
                timer.cancel()
            self._live, self._retiring = None, {}
            self._releasing = asyncio.ensure_future(self._rebuild_alone(olds, w.lenient))
        elif not w.lenient:
            self._build(w.roots, lenient=True)

    async def _rebuild_alone(self, olds: list[_Watch], lenient: bool) -> None:
        """Build again once the ended watchers gave their inotify watches back: each
        task ends after its watchfiles thread saw the stop and closed its instance
        (built before that, the new one met the limit again, and alone was then built
        passing over it: part of its folders unwatched). Restarts meanwhile wait."""
        await asyncio.gather(*(o.task for o in olds if o.task is not None), return_exceptions=True)
        self._releasing, self._deferred = None, False
        if roots := self._roots_now():
            self._build(roots, lenient=lenient)

    def _retire(self, w: _Watch) -> None:
        """End ``w`` once it has reported what it saw before its successor watched: a
        change waits in its polling step, for up to two steps and the debounce, and
        ending it drops what it holds. Both report meanwhile: the second report of a
        change is no change (``_changed``)."""
        linger = (3 * self.poll_step_ms + DEBOUNCE_MS) / 1000

        def end() -> None:
            if self._retiring.pop(w, None) is not None:
                self._end(w)
                if self._deferred:
                    self._deferred = False
                    self.restart()

        self._retiring[w] = asyncio.get_running_loop().call_later(linger, end)

    async def _in_thread(self, scan: Callable[[], T]) -> tuple[int, T]:
        """``scan`` in a thread, and when it began: a look the watcher takes at a path
        after that is newer than what the scan found for it (``_differences``)."""
        began = time.monotonic_ns()
        self._scanning.append(began)
        try:
            return began, await asyncio.to_thread(scan)
        finally:
            self._scanning.remove(began)

    async def _catch_up(self, behind: list[Armed]) -> None:
        """One thread scans them all (a start-up arms every session at once)."""

        def scan_all() -> list[tuple[Armed, dict[str, Look] | None]]:
            found: list[tuple[Armed, dict[str, Look] | None]] = []
            for armed in behind:
                assert armed.session.spec is not None
                try:
                    found.append((armed, self._scan(armed.session.spec)))
                except OSError:  # a workspace gone: this session's scan, not the others'
                    log.exception("watch.scan_failed", session=armed.session.name)
                    found.append((armed, None))
            return found

        began, found = await self._in_thread(scan_all)
        for scanned, now in found:
            if now is None or (armed := self._current(scanned)) is None:
                continue  # re-armed meanwhile: its new baseline is newer than `now`
            if missed := self._differences(armed, now, began):
                log.info("watch.caught_up", session=armed.session.name, paths=sorted(missed))
                self._collect(armed, missed)

    def _current(self, scanned: Armed) -> Armed | None:
        """The arming a scan taken for ``scanned`` applies to: itself, or a re-arming
        that kept its looks (``keep_looks``); none when a new baseline was taken
        since (newer than the scan)."""
        armed = self.armed.get(scanned.session.name)
        return armed if armed is not None and armed.lineage is scanned.lineage else None

    # --- routing and debounce ---------------------------------------------------------

    def route(self, paths: set[str]) -> None:
        """Send changed absolute paths to the sessions that watch them."""
        for armed in list(self.armed.values()):
            spec = armed.session.spec
            assert spec is not None
            workspace = str(spec.workspace).rstrip("/") + "/"
            gits = [str(g) + "/" for g in git_dirs(spec)]
            if any(p.startswith(g) or p + "/" == g for p in paths for g in gits):
                self.check_git(armed)
            hits = {p[len(workspace) :] for p in paths if p.startswith(workspace)}
            hits = {h for h in hits if not h.startswith(".git/") and h != ".git"}
            wanted = {h for h in hits if watched(spec, h)}
            if wanted:  # the watcher follows links: not out of the workspace, though
                real = os.path.realpath(spec.workspace)
                wanted = {h for h in wanted if inside(real, workspace + h)}
            wanted = {h for h in wanted if self._changed(armed, h)}
            if wanted:
                self._collect(armed, wanted)

    @staticmethod
    def _changed(armed: Armed, rel: str) -> bool:
        """Did the content of a path the watcher reported change since the last look?
        Not if its modification time, size and inode are the same (``_look``): only
        its attributes changed (inotify reports those as a change too), e.g. the ACL
        the first run of a session grants its uid on the workspace, which would wake
        it again; nor if it is gone and was not there at the last look (a file made
        and removed in between, or a deletion a replaced watcher reports too). The
        look is the last scan's, or the watcher's: the reconciliation then need not
        report it."""
        spec = armed.session.spec
        assert spec is not None
        armed.looked[rel] = time.monotonic_ns()
        try:
            st = os.stat(spec.workspace / rel)
        except OSError:  # gone (or unreadable)
            return armed.scan.pop(rel, None) is not None
        now = look(st)
        if armed.scan.get(rel) == now:
            return False
        armed.scan[rel] = now
        return True

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
        bound = s.journal.state.bound
        changed_bound = sorted(
            p
            for p in paths
            if p in spec.bind.files and file_hash(spec.workspace / p) != bound.get(p)
        )
        watched = sorted(p for p in paths if watch_matches(spec, p))
        if watched:
            self.host.spawn(
                self.host.wake(
                    s, "watch", {"paths": watched}, frozenset(watched) | frozenset(changed_bound)
                )
            )
        elif changed_bound:
            self.host.spawn(
                self.host.wake(s, "dependency", {"paths": changed_bound}, frozenset(changed_bound))
            )

    # --- reconciliation ---------------------------------------------------------------

    # tests replace it (a scan that a change overtakes)
    _scan = staticmethod(scan)

    def baseline_scan(self, armed: Armed) -> None:
        """What is there when the session is armed: later scans report differences."""
        spec = armed.session.spec
        assert spec is not None
        if watches_files(spec):
            armed.scan = self._scan(spec)

    def keep_looks(self, old: Armed, new: Armed) -> bool:
        """A re-arming that watches the same paths (the end of each run of a session
        with an ``every`` trigger) keeps the old arming's looks instead of a new
        baseline: no scan on the event loop (a ``src/**`` over a big tree takes a
        while, at each run's end), and the watcher reports what it has not reported
        yet against them; what waits in the debounce window still wakes the session.
        False when the paths differ: a new baseline, and ``carry_over``."""
        before, spec = old.spec, new.spec
        if before is None or spec is None or _watch_set(before) != _watch_set(spec):
            return False
        new.scan, new.looked, new.lineage = old.scan, old.looked, old.lineage
        if old.pending_paths:
            self._collect(new, set(old.pending_paths))
        return True

    def carry_over(self, old: Armed, new: Armed) -> None:
        """A re-arming that watches other paths (its spec changed) takes a new
        baseline: what changed since the old arming's last look (which
        the watcher may not have reported yet) and what waits in its debounce window
        still wake the session, for the paths both armings watch."""
        before, spec = old.spec, new.spec
        if before is None or spec is None or before.workspace != spec.workspace:
            return
        changed = {p for p, v in new.scan.items() if old.scan.get(p) != v}
        changed |= set(old.scan) - set(new.scan)
        changed = {p for p in changed if watched(before, p)} | old.pending_paths
        if carried := {p for p in changed if watched(spec, p)}:
            self._collect(new, carried)

    def _differences(
        self, armed: Armed, now: dict[str, Look], began: int | None = None
    ) -> set[str]:
        """Watched paths that differ from the last look and are not waiting to wake it;
        ``now``, a scan that ``began`` then, becomes the last look, except for the
        paths the watcher looked at since: its look is newer (the change it saw is
        not missed, and the scan's is no baseline)."""
        spec = armed.session.spec
        assert spec is not None
        if began is not None:
            newer = {p for p, t in armed.looked.items() if t > began}
            now = {p: v for p, v in now.items() if p not in newer}
            now |= {p: armed.scan[p] for p in newer if p in armed.scan}
            oldest = min([began, *self._scanning])  # what a scan still running needs
            armed.looked = {p: t for p, t in armed.looked.items() if t > oldest}
        missed = {p for p, v in now.items() if armed.scan.get(p) != v}
        missed |= set(armed.scan) - set(now)
        armed.scan = now
        return {p for p in missed if watched(spec, p)} - armed.pending_paths

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE)
            for armed in list(self.armed.values()):
                spec = armed.session.spec
                # every session that watches files: one whose first scan found nothing
                # too (its files may all be new)
                if spec is None or not watches_files(spec):
                    continue
                try:
                    began, now = await self._in_thread(functools.partial(self._scan, spec))
                except OSError:  # a workspace gone: this session's scan, not the loop
                    log.exception("watch.scan_failed", session=armed.session.name)
                    continue
                if (current := self._current(armed)) is None:
                    continue  # re-armed meanwhile: its new baseline is newer than `now`
                missed = self._differences(current, now, began)
                if missed:
                    log.warning(
                        "watch.reconciled", session=armed.session.name, missed=sorted(missed)
                    )
                    self._collect(current, missed)
