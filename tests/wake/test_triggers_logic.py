"""Trigger routing and debouncing, fed by a scripted change source (no real watcher)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec
from sessiond.wake.armed import Armed
from sessiond.wake.globs import match
from sessiond.wake.triggers import Triggers


class FakeKernel:
    def __init__(self) -> None:
        self.wakes: list[tuple[str, str, dict[str, Any]]] = []
        self.table: list[Session] = []

    def spawn(self, coro: Any) -> None:
        coro.close()  # the wake itself is recorded below, not run

    def wake(self, s: Session, trigger: str, details: dict[str, Any], paths: Any = None) -> Any:
        self.wakes.append((s.name, trigger, details))

        async def nothing() -> None:
            return None

        return nothing()


class FakeJournal:
    class state:  # noqa: N801 - stands in for the folded State
        bound: dict[str, str | None] = {}  # noqa: RUF012 - set per test


def armed_session(folder: Path, triggers: str) -> Session:
    spec = parse_spec(f'name = "w"\n[run]\nexec = ["true"]\ncwd = "."\n{triggers}', base=folder)
    return Session("w", FakeJournal(), spec)  # type: ignore[arg-type]


def test_globs_match_files_and_whole_folders() -> None:
    assert match("data/a.csv", ["data/*.csv"])
    assert not match("data/sub/a.csv", ["data/*.csv"])
    assert match("src/pkg/mod.py", ["src/**"])
    assert match("docs/api.md", ["docs"])
    assert not match("docsx/api.md", ["docs"])


def test_a_burst_of_changes_becomes_one_wake_with_every_path(tmp_path: Path) -> None:
    async def go() -> FakeKernel:
        kernel = FakeKernel()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        s = armed_session(
            tmp_path,
            '[[trigger]]\ntype = "watch"\npaths = ["data/*"]\nexclude = ["data/tmp*"]\n'
            'debounce = "50ms"\n',
        )
        triggers.armed["w"] = Armed(s)
        base = str(tmp_path)
        (tmp_path / "data").mkdir()
        (tmp_path / "other").mkdir()
        for batch in (["data/a", "data/tmp1"], ["data/b", "other/c"], ["data/a"]):
            for p in batch:  # a path reported is one that changed (a look tells)
                (tmp_path / p).write_text(f"{batch}\n")
            triggers.route({f"{base}/{p}" for p in batch})
        await asyncio.sleep(0.2)
        (tmp_path / "data" / "late").write_text("late\n")
        triggers.route({f"{base}/data/late"})
        await asyncio.sleep(0.2)
        return kernel

    kernel = asyncio.run(go())
    assert kernel.wakes == [
        ("w", "watch", {"paths": ["data/a", "data/b"]}),
        ("w", "watch", {"paths": ["data/late"]}),
    ]


def test_a_bound_file_wakes_only_when_its_content_changed(tmp_path: Path) -> None:
    async def go() -> FakeKernel:
        kernel = FakeKernel()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        (tmp_path / "rates.csv").write_text("1\n")
        s = armed_session(tmp_path, '[bind]\nfiles = ["rates.csv"]\n')
        import hashlib

        FakeJournal.state.bound = {"rates.csv": hashlib.sha256(b"1\n").hexdigest()}
        triggers.armed["w"] = Armed(s)
        triggers.route({f"{tmp_path}/rates.csv"})  # touched, same content
        await asyncio.sleep(0.3)
        (tmp_path / "rates.csv").write_text("2\n")
        triggers.route({f"{tmp_path}/rates.csv"})
        await asyncio.sleep(0.3)
        return kernel

    kernel = asyncio.run(go())
    assert kernel.wakes == [("w", "dependency", {"paths": ["rates.csv"]})]


def test_a_file_deleted_during_a_scan_is_not_there_and_the_scan_goes_on(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The reconciliation scan (a thread of the watcher's loop) lists files, then
    looks at each; one deleted in between must not end the scan (nor the loop)."""
    from sessiond.wake.watch import Watcher

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep").write_text("x")
    victim = tmp_path / "data" / "gone"
    victim.write_text("y")
    s = armed_session(tmp_path, '[[trigger]]\ntype = "watch"\npaths = ["data/*"]\n')
    assert s.spec is not None
    real_scandir = os.scandir

    class ListedThenDeleted:
        def __init__(self, folder: Any) -> None:
            self.entries = list(real_scandir(folder))

        def __enter__(self) -> Any:
            if any(e.path == str(victim) for e in self.entries):
                victim.unlink()  # listed, then deleted before it is looked at
            return iter(self.entries)

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(os, "scandir", ListedThenDeleted)
    found = Watcher._scan(s.spec)
    assert "data/keep" in found
    assert "data/gone" not in found


class WakeSignal(FakeKernel):
    """Sets ``woken`` at each wake, for a test to wait on."""

    def __init__(self) -> None:
        super().__init__()
        self.woken = asyncio.Event()

    def wake(self, s: Session, trigger: str, details: dict[str, Any], paths: Any = None) -> Any:
        self.woken.set()
        return super().wake(s, trigger, details, paths)


def test_the_reconciliation_finds_a_file_in_a_folder_that_was_empty_at_arming(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A session armed on an empty folder has an empty first scan; the reconciliation
    must look at it all the same (it used to skip it, so a change the watcher did not
    report, e.g. made before the watch was in place, never woke the session)."""
    from sessiond.wake import watch

    monkeypatch.setattr(watch, "RECONCILE", 0.0)

    async def go() -> WakeSignal:
        kernel = WakeSignal()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        (tmp_path / "data").mkdir()
        s = armed_session(tmp_path, '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\n')
        armed = Armed(s)
        triggers.armed["w"] = armed
        triggers.watcher.baseline_scan(armed)
        assert armed.scan == {}
        (tmp_path / "data" / "a.csv").write_text("1\n")
        triggers.watcher.start_reconciler()
        try:
            await asyncio.wait_for(kernel.woken.wait(), 60)
        finally:
            await triggers.watcher.close()
        return kernel

    kernel = asyncio.run(go())
    assert kernel.wakes == [("w", "watch", {"paths": ["data/a.csv"]})]


def test_a_change_of_a_watched_files_attributes_alone_wakes_nothing(tmp_path: Path) -> None:
    """inotify reports a changed mode or ACL as a change; the first run of a session
    grants its uid an ACL on the workspace, which woke it a second time."""

    async def go() -> WakeSignal:
        kernel = WakeSignal()
        triggers = Triggers(kernel, clock=lambda: 0.0, poll_step_ms=15)  # type: ignore[arg-type]
        (tmp_path / "data").mkdir()
        target = tmp_path / "data" / "a.csv"
        target.write_text("1\n")
        s = armed_session(tmp_path, '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\n')
        armed = Armed(s)
        triggers.armed["w"] = armed
        triggers.watcher.baseline_scan(armed)
        target.chmod(0o600)
        triggers.route({str(target)})
        assert (armed.pending_paths, armed.flush) == (set(), None)  # nothing to wake for
        target.write_text("1,2\n")
        triggers.route({str(target)})
        assert armed.pending_paths == {"data/a.csv"}
        await asyncio.wait_for(kernel.woken.wait(), 60)
        await triggers.watcher.close()
        return kernel

    kernel = asyncio.run(go())
    assert kernel.wakes == [("w", "watch", {"paths": ["data/a.csv"]})]
