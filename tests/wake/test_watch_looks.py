"""What the watcher takes for a change: its scans against the trigger's glob dialect,
its looks at a file against the scans', a re-arming and a watcher's replacement.
Real files; the watcher's own reports are fed by hand except where the handover of
one real watchfiles watcher to the next is what is tested."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec
from sessiond.wake.armed import Armed
from sessiond.wake.triggers import Triggers
from sessiond.wake.watch import Watcher
from tests.wake.test_triggers_logic import FakeJournal, FakeKernel, armed_session

DOUBLE_STAR = '[[trigger]]\ntype = "watch"\npaths = ["src/**"]\n'


class Kernel(FakeKernel):
    """Runs what the watcher spawns (a catch-up scan); sets ``woken`` at each wake."""

    def __init__(self) -> None:
        super().__init__()
        self.woken = asyncio.Event()
        self.table = Table()
        self.tasks: set[asyncio.Future[Any]] = set()

    def spawn(self, coro: Any) -> None:
        self.tasks.add(asyncio.ensure_future(coro))

    def wake(self, s: Session, trigger: str, details: dict[str, Any], paths: Any = None) -> Any:
        self.woken.set()
        return super().wake(s, trigger, details, paths)


class Table(list[Session]):
    @property
    def sessions(self) -> dict[str, Session]:
        return {s.name: s for s in self}


class Sleeping(FakeJournal):
    class state(FakeJournal.state):  # noqa: N801 - stands in for the folded State
        state = "sleeping"


def tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a = 1\n")
    (root / "src" / "pkg" / "m.py").write_text("m = 1\n")
    (root / "docs").mkdir()
    (root / "docs" / "api.md").write_text("# api\n")


def test_a_scan_finds_the_files_a_folder_or_double_star_glob_covers(tmp_path: Path) -> None:
    """The scans (baseline, catch-up, reconciliation) must see what the routing
    watches: ``src/**`` (every file under src, the documented default) and a folder
    named alone. pathlib's glob took ``src/**`` for folders only, so a change made
    before the watch was in place was never caught up for such a session."""
    tree(tmp_path)
    s = armed_session(tmp_path, DOUBLE_STAR + '[[trigger]]\ntype = "watch"\npaths = ["docs"]\n')
    assert s.spec is not None
    found = Watcher._scan(s.spec)
    assert {"src/a.py", "src/pkg/m.py", "docs/api.md"} <= set(found)


def test_an_acl_or_mode_change_under_a_double_star_glob_wakes_nothing(tmp_path: Path) -> None:
    """The first run of a session grants its uid an ACL on every entry of the
    workspace: under ``src/**`` each file and folder was taken for new (the scan had
    not recorded them) and woke the session again with all of them."""

    async def go() -> Armed:
        triggers = Triggers(Kernel(), clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        tree(tmp_path)
        armed = Armed(armed_session(tmp_path, DOUBLE_STAR))
        triggers.armed["w"] = armed
        triggers.watcher.baseline_scan(armed)
        changed = [tmp_path / "src" / "pkg", tmp_path / "src" / "pkg" / "m.py"]
        for path in changed:
            path.chmod(0o700)
        triggers.route({str(p) for p in changed})
        await triggers.watcher.close()
        return armed

    armed = asyncio.run(go())
    assert armed.pending_paths == set()
    assert armed.flush is None


def test_a_file_the_watcher_reported_under_a_folder_glob_is_not_reported_again(
    tmp_path: Path,
) -> None:
    """A file under a folder pattern, once reported by the watcher, was missing from
    the next scan (pathlib's glob does not go into the folder) and the reconciliation
    woke the session a second time for it, as deleted."""

    async def go() -> set[str]:
        triggers = Triggers(Kernel(), clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        (tmp_path / "docs").mkdir()
        s = armed_session(tmp_path, '[[trigger]]\ntype = "watch"\npaths = ["docs"]\n')
        armed = Armed(s)
        triggers.armed["w"] = armed
        triggers.watcher.baseline_scan(armed)
        (tmp_path / "docs" / "api.md").write_text("# api\n")
        triggers.route({str(tmp_path / "docs" / "api.md")})
        assert armed.pending_paths == {"docs/api.md"}
        armed.pending_paths.clear()  # (woken)
        assert s.spec is not None
        again = triggers.watcher._differences(armed, Watcher._scan(s.spec))
        await triggers.watcher.close()
        return again

    assert asyncio.run(go()) == set()


def test_a_file_under_a_symlinked_folder_is_scanned_as_the_watcher_reports_it(
    tmp_path: Path,
) -> None:
    """The watcher follows a symlinked folder in a watched tree (watchfiles may
    report a file written in its target under the link's path); the scans did not go
    into it, so the next reconciliation took the file the watcher had reported for
    deleted and woke the session again (and a change there made before the watch
    was in place was never caught up). A symlink back to a folder above is no
    endless walk. (The report is fed by hand: for a target in the workspace, which
    of its two paths inotify's one watch reports is watchfiles' choice.)"""
    ws = tmp_path / "ws"
    elsewhere = ws / "elsewhere"  # in the workspace, out of the watched folder
    elsewhere.mkdir(parents=True)
    (elsewhere / "old.py").write_text("old = 1\n")
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "link").symlink_to(elsewhere)
    (ws / "src" / "loop").symlink_to(ws / "src")

    async def go() -> tuple[Kernel, dict[str, Any], set[str]]:
        kernel = Kernel()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        armed = Armed(Session("w", Sleeping(), armed_session(ws, DOUBLE_STAR).spec))  # type: ignore[arg-type]
        triggers.armed["w"] = armed
        triggers.watcher.baseline_scan(armed)
        baseline = dict(armed.scan)
        (elsewhere / "new.py").write_text("new = 1\n")
        triggers.route({str(ws / "src" / "link" / "new.py")})  # as the watcher reports it
        await asyncio.wait_for(kernel.woken.wait(), 30)
        assert armed.session.spec is not None
        again = triggers.watcher._differences(armed, Watcher._scan(armed.session.spec))
        await triggers.watcher.close()
        return kernel, baseline, again

    kernel, baseline, again = asyncio.run(go())
    assert kernel.wakes == [("w", "watch", {"paths": ["src/link/new.py"]})]
    assert again == set()  # the next reconciliation: nothing missed
    assert "src/link/old.py" in baseline


def test_a_link_out_of_the_workspace_shows_its_session_nothing_out_there(
    tmp_path: Path,
) -> None:
    """A run may link anything into its workspace: a folder of the daemon's state, or
    another session's. The watcher follows the link (a change out there is reported
    under the link's path) and so did the scans: the session was woken with the
    names of the files changed out there, which its run may not see (the daemon
    sees more: another uid, the sandbox's view). Neither counts them now; a change
    in the workspace itself still wakes it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("s = 1\n")
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "out").symlink_to(outside)
    (ws / "src" / "peek.py").symlink_to(outside / "secret.py")

    async def go() -> tuple[Kernel, dict[str, Any]]:
        kernel = Kernel()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        armed = Armed(Session("w", Sleeping(), armed_session(ws, DOUBLE_STAR).spec))  # type: ignore[arg-type]
        triggers.armed["w"] = armed
        triggers.watcher.baseline_scan(armed)
        baseline = dict(armed.scan)
        triggers.watcher.restart()  # a real watcher
        await until(lambda: triggers.watcher._live is not None, "the watcher")
        (outside / "new.py").write_text("new = 1\n")
        (outside / "secret.py").write_text("s = 2\n")
        (ws / "src" / "mine.py").write_text("m = 1\n")  # reported after those
        try:
            await asyncio.wait_for(kernel.woken.wait(), 30)
        finally:
            await triggers.close()
        return kernel, baseline

    kernel, baseline = asyncio.run(go())
    assert baseline == {}  # nothing out there, through either link
    assert kernel.wakes == [("w", "watch", {"paths": ["src/mine.py"]})]


def test_a_scan_older_than_the_watchers_look_neither_wakes_again_nor_stays_the_baseline(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A catch-up scan runs in a thread: a change the watcher reported meanwhile was
    taken again from the older snapshot (a second wake), which also became the
    baseline (a third, from the next reconciliation)."""
    real_scan = Watcher._scan
    scanned = threading.Event()
    go_on = threading.Event()

    def slow_scan(spec: Any) -> Any:
        found = real_scan(spec)
        scanned.set()
        go_on.wait(60)
        return found

    monkeypatch.setattr(Watcher, "_scan", staticmethod(slow_scan))
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "a.csv"
    target.write_text("1\n")

    async def go() -> tuple[Kernel, Armed]:
        kernel = Kernel()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        s = armed_session(tmp_path, '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\n')
        armed = Armed(s)
        triggers.armed["w"] = armed
        armed.scan = real_scan(s.spec)  # type: ignore[arg-type]
        catching_up = asyncio.ensure_future(triggers.watcher._catch_up([armed]))
        await asyncio.to_thread(scanned.wait, 60)
        target.write_text("1,2,3\n")  # after the snapshot
        triggers.route({str(target)})
        await asyncio.wait_for(kernel.woken.wait(), 60)
        go_on.set()
        await catching_up
        await triggers.watcher.close()
        return kernel, armed

    kernel, armed = asyncio.run(go())
    assert kernel.wakes == [("w", "watch", {"paths": ["data/a.csv"]})]
    assert (armed.pending_paths, armed.flush) == (set(), None)
    st = target.stat()
    assert armed.scan["data/a.csv"][:2] == (st.st_mtime_ns, st.st_size)


def test_a_file_replaced_with_the_same_time_and_size_is_a_change(tmp_path: Path) -> None:
    """A new version renamed over the old one (rsync, an editor, an archive unpacked)
    keeps the old time when its tool sets it, and often the size: the inode is new."""

    async def go() -> Armed:
        triggers = Triggers(Kernel(), clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        (tmp_path / "data").mkdir()
        target = tmp_path / "data" / "a.csv"
        target.write_text("1,2\n")
        s = armed_session(tmp_path, '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\n')
        armed = Armed(s)
        triggers.armed["w"] = armed
        triggers.watcher.baseline_scan(armed)
        st = target.stat()
        new = tmp_path / "data" / ".a.csv.tmp"
        new.write_text("3,4\n")
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
        new.rename(target)
        triggers.route({str(target)})
        await triggers.watcher.close()
        return armed

    assert asyncio.run(go()).pending_paths == {"data/a.csv"}


def test_a_change_the_watcher_had_not_reported_yet_survives_a_rearming(tmp_path: Path) -> None:
    """A session is re-armed at the end of each run when it has an ``every`` trigger,
    and at a spec change: the new arming's baseline took in a change the watcher had
    not reported yet (then taken for no change), and one waiting in the debounce
    window was dropped."""

    async def go() -> Kernel:
        kernel = Kernel()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        (tmp_path / "data").mkdir()
        spec = parse_spec(
            'name = "w"\n[run]\nexec = ["true"]\ncwd = "."\n[[trigger]]\ntype = "watch"\n'
            'paths = ["data/*.csv"]\ndebounce = "50ms"\n',
            base=tmp_path,
        )
        s = Session("w", Sleeping(), spec)  # type: ignore[arg-type]
        kernel.table.append(s)
        triggers.arm(s)
        (tmp_path / "data" / "a.csv").write_text("1\n")
        triggers.route({str(tmp_path / "data" / "a.csv")})  # waits in the debounce window
        (tmp_path / "data" / "b.csv").write_text("2\n")  # not reported yet
        triggers.arm(s)  # e.g. its run ended
        triggers.route({str(tmp_path / "data" / "b.csv")})
        await asyncio.wait_for(kernel.woken.wait(), 60)
        await triggers.close()
        return kernel

    kernel = asyncio.run(go())
    assert [sorted(w[2]["paths"]) for w in kernel.wakes] == [["data/a.csv", "data/b.csv"]]


async def until(condition: Callable[[], bool], what: str) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(poll(), 60)
    except TimeoutError:
        raise AssertionError(f"no {what} within 60 s") from None


def test_what_the_replaced_watcher_saw_last_still_wakes_its_session(tmp_path: Path) -> None:
    """A new watcher (new roots) ends the one it replaces once it watches; a change in
    a root both watch, made just before, sat in the old watcher's polling step and
    was dropped with it (the new one does not scan the roots it shares). A long step
    makes the window wide enough to hit every time."""

    async def go() -> Kernel:
        kernel = Kernel()
        gate, held = asyncio.Event(), asyncio.Event()
        gate.set()

        async def hold(point: str, _: str) -> None:
            held.set()
            await gate.wait()

        triggers = Triggers(kernel, lambda: 0.0, poll_step_ms=1_000, hold=hold)  # type: ignore[arg-type]
        for name in ("a", "b"):
            (tmp_path / name / "data").mkdir(parents=True)
        specs = {
            name: parse_spec(
                f'name = "{name}"\n[run]\nexec = ["true"]\ncwd = "."\n'
                '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\n',
                base=tmp_path / name,
            )
            for name in ("a", "b")
        }
        a = Armed(Session("a", Sleeping(), specs["a"]))  # type: ignore[arg-type]
        triggers.armed["a"] = a
        triggers.watcher.restart()
        await until(lambda: triggers.watcher._live is not None, "first watcher")
        gate.clear()
        held.clear()
        triggers.armed["b"] = Armed(Session("b", Sleeping(), specs["b"]))  # type: ignore[arg-type]
        triggers.watcher.restart()
        await held.wait()
        (tmp_path / "a" / "data" / "x.csv").write_text("1\n")  # the first watcher's alone
        gate.set()
        await until(lambda: triggers.watcher._next is None, "second watcher")
        try:
            await asyncio.wait_for(kernel.woken.wait(), 30)
        finally:
            await triggers.close()
        return kernel

    kernel = asyncio.run(go())
    assert kernel.wakes == [("a", "watch", {"paths": ["data/x.csv"]})]


def inotify_instances() -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if "inotify" in _link(f"/proc/self/fd/{fd}"))


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_a_burst_of_armings_in_new_folders_holds_three_watchers_at_most(tmp_path: Path) -> None:
    """A replaced watcher lingers to report what it saw last; a watcher built at each
    arming of a burst (a script creating sessions) held one more inotify instance,
    its watches and its thread each time, up to the user's limit of instances. The
    last folder is watched all the same once the burst is over."""

    async def go() -> tuple[int, Kernel]:
        kernel = Kernel()
        triggers = Triggers(kernel, lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        watcher = triggers.watcher
        before, most = inotify_instances(), 0
        for i in range(12):
            folder = tmp_path / f"w{i}"
            (folder / "data").mkdir(parents=True)
            spec = parse_spec(
                f'name = "s{i}"\n[run]\nexec = ["true"]\ncwd = "."\n'
                '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\n',
                base=folder,
            )
            triggers.armed[f"s{i}"] = Armed(Session(f"s{i}", Sleeping(), spec))  # type: ignore[arg-type]
            watcher.restart()
            await until(lambda: watcher._next is None, "the watcher's start")
            most = max(most, inotify_instances() - before)
        last = str(tmp_path / "w11")
        await until(lambda: watcher._live is not None and last in watcher._live.roots, "w11")
        (tmp_path / "w11" / "data" / "x.csv").write_text("1\n")
        try:
            await asyncio.wait_for(kernel.woken.wait(), 30)
        finally:
            await triggers.close()
        return most, kernel

    most, kernel = asyncio.run(go())
    assert most <= 3
    assert kernel.wakes == [("s11", "watch", {"paths": ["data/x.csv"]})]


CSV = '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\ndebounce = "50ms"\n'


def test_a_rearming_that_watches_the_same_paths_scans_nothing_on_the_event_loop(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A session with an ``every`` trigger is re-armed at the end of each run: each
    re-arming scanned its workspace on the event loop for a new baseline (for
    ``src/**`` over a tree of 20 000 files, 0.4 s during which the daemon answered
    nothing). The same paths watched: the looks of the arming before hold."""
    real_scan = Watcher._scan
    on_the_loop: list[str] = []

    def counted(spec: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            on_the_loop.append(spec.name)
        return real_scan(spec)

    monkeypatch.setattr(Watcher, "_scan", staticmethod(counted))
    (tmp_path / "data").mkdir()

    async def go() -> None:
        triggers = Triggers(Kernel(), clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        s = Session("w", Sleeping(), armed_session(tmp_path, CSV).spec)  # type: ignore[arg-type]
        triggers.arm(s)
        triggers.arm(s)  # its run ended
        triggers.arm(s)
        await triggers.close()

    asyncio.run(go())
    assert on_the_loop == ["w"]  # the first arming's baseline alone


def test_a_catch_up_scan_for_the_arming_before_wakes_the_one_that_kept_its_looks(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A re-arming that keeps the looks of the one before takes no baseline of its
    own: a new watcher's catch-up scan taken for the arming before (a change made
    before the watch was in place) must still count for it."""
    real_scan = Watcher._scan
    scanned, go_on = threading.Event(), threading.Event()

    def slow_in_a_thread(spec: Any) -> Any:
        found = real_scan(spec)
        if threading.current_thread() is not threading.main_thread():
            scanned.set()
            go_on.wait(60)
        return found

    monkeypatch.setattr(Watcher, "_scan", staticmethod(slow_in_a_thread))
    (tmp_path / "data").mkdir()

    async def go() -> Kernel:
        kernel = Kernel()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        s = Session("w", Sleeping(), armed_session(tmp_path, CSV).spec)  # type: ignore[arg-type]
        triggers.arm(s)
        (tmp_path / "data" / "b.csv").write_text("2\n")  # before the watch was in place
        catching_up = asyncio.ensure_future(triggers.watcher._catch_up([triggers.armed["w"]]))
        await asyncio.to_thread(scanned.wait, 60)
        triggers.arm(s)  # its run ended
        go_on.set()
        await catching_up
        assert triggers.armed["w"].pending_paths == {"data/b.csv"}
        await asyncio.wait_for(kernel.woken.wait(), 60)
        await triggers.close()
        return kernel

    kernel = asyncio.run(go())
    assert kernel.wakes == [("w", "watch", {"paths": ["data/b.csv"]})]
