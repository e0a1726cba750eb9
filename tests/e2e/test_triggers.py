"""Triggers through the real daemon: watch, dependency and git on the real file system
and repositories. Cron, every, limits and cool-downs run in process, on its manual
clock (tests/inproc/test_triggers.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.harness import Daemon, held_daemon, running, short_dir, wait_event, wait_for

RECORD = 'cat \\"$SESSIOND_WAKE_FILE\\" >> wakes.jsonl; echo >> wakes.jsonl'


def wakes(root: Path) -> list[dict[str, Any]]:
    path = root / "wakes.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_file_change_wakes_a_watching_session_with_the_paths() -> None:
    with running() as d:
        (d.root / "data").mkdir()
        spec = (
            f'name = "w"\n[run]\nexec = ["sh", "-c", "{RECORD}"]\ncwd = "."\n'
            '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\nexclude = ["data/tmp*"]\n'
        )
        d.ctl("create", str(d.write_spec("w", spec)), check=True)
        (d.root / "data" / "tmp.csv").write_text("ignored\n")
        (d.root / "data" / "a.csv").write_text("1,2\n")
        (d.root / "data" / "b.csv").write_text("3,4\n")

        # The burst is one wake when both writes fall in one debounce window (200 ms),
        # which a busy machine does not promise: the paths may come in more wakes
        # (the wake storm test below bounds how many).
        def seen() -> list[str]:
            return [p for c in wakes(d.root) for w in c["wakes"] for p in w["details"]["paths"]]

        wait_for(lambda: {"data/a.csv", "data/b.csv"} <= set(seen()), what="both paths")
        assert set(seen()) == {"data/a.csv", "data/b.csv"}  # tmp excluded
        assert all(w["trigger"] == "watch" for c in wakes(d.root) for w in c["wakes"])
        assert d.json("show", "w")["next_wake"] == "on change of data/*.csv"


def test_a_change_made_before_the_watch_is_in_place_still_wakes_the_session() -> None:
    """``create`` is answered before the watcher's inotify watches are in place (they
    are built on the loop's next turn): a file written at once, in between, must wake
    the session all the same. Held here at ``watch-arm`` so that the write surely
    falls in between; then a second session in another folder replaces the watcher
    (new roots), and the first one's folder is watched throughout."""
    with held_daemon("watch-arm") as d:
        d.start()
        (d.root / "data").mkdir()
        spec = (
            f'name = "w"\n[run]\nexec = ["sh", "-c", "{RECORD}"]\ncwd = "."\n'
            '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\n'
        )
        (d.root / "go").unlink()
        since = len(d.lines)
        d.ctl("create", str(d.write_spec("w", spec)), check=True)
        d.wait_line("fault.held", match=lambda line: line["point"] == "watch-arm", since=since)
        (d.root / "data" / "a.csv").write_text("1,2\n")  # no watch yet
        (d.root / "go").touch()
        caught = d.wait_line("watch.caught_up", since=since)
        assert caught["paths"] == ["data/a.csv"]
        first = wait_event(d, "w", "run.finished")
        assert [w["details"]["paths"] for c in wakes(d.root) for w in c["wakes"]] == [
            ["data/a.csv"]
        ]

        # another workspace: a new watcher over both folders, held before it watches;
        # the old one still reports the first folder's changes meanwhile
        other = short_dir()
        (other / "data").mkdir()
        (d.root / "go").unlink()
        since = len(d.lines)
        spec2 = (
            'name = "v"\n[run]\nexec = ["true"]\n'
            f'cwd = "{other}"\n[[trigger]]\ntype = "watch"\npaths = ["data/*"]\n'
        )
        d.ctl("create", str(d.write_spec("v", spec2)), check=True)
        d.wait_line("fault.held", match=lambda line: line["point"] == "watch-arm", since=since)
        (d.root / "data" / "a.csv").chmod(0o600)  # its attributes alone: no change
        (d.root / "data" / "b.csv").write_text("3,4\n")
        try:
            wait_event(d, "w", "run.finished", since=first["seq"] + 1)
            assert [w["details"]["paths"] for c in wakes(d.root) for w in c["wakes"]] == [
                ["data/a.csv"],
                ["data/b.csv"],
            ]
            (d.root / "go").touch()
            d.wait_line(
                "watch.started", match=lambda line: str(other) in line["roots"], since=since
            )
        finally:
            shutil.rmtree(other, ignore_errors=True)


def test_a_session_watching_a_folder_glob_is_caught_up_and_not_woken_by_a_chmod() -> None:
    """``src/**`` (the documented default) covers every file under src: the scans
    must see them as the routing does. pathlib's glob took it for folders only, so
    a file written before the watch was in place was never caught up, and a mode
    change (as the ACL of a session's first run) on a file there woke the session."""
    with held_daemon("watch-arm") as d:
        d.start()
        (d.root / "src" / "pkg").mkdir(parents=True)
        (d.root / "src" / "pkg" / "m.py").write_text("m = 1\n")
        spec = (
            f'name = "w"\n[run]\nexec = ["sh", "-c", "{RECORD}"]\ncwd = "."\n'
            '[[trigger]]\ntype = "watch"\npaths = ["src/**"]\n'
        )
        (d.root / "go").unlink()
        since = len(d.lines)
        d.ctl("create", str(d.write_spec("w", spec)), check=True)
        d.wait_line("fault.held", match=lambda line: line["point"] == "watch-arm", since=since)
        (d.root / "src" / "pkg" / "new.py").write_text("n = 1\n")  # no watch yet
        (d.root / "go").touch()
        caught = d.wait_line("watch.caught_up", since=since)
        assert caught["paths"] == ["src/pkg/new.py"]
        first = wait_event(d, "w", "run.finished")
        for path in (d.root / "src" / "pkg", d.root / "src" / "pkg" / "m.py"):
            path.chmod(0o700)  # attributes alone: no change
        (d.root / "src" / "b.py").write_text("b = 1\n")
        wait_event(d, "w", "run.finished", since=first["seq"] + 1)
        assert [w["details"]["paths"] for c in wakes(d.root) for w in c["wakes"]] == [
            ["src/pkg/new.py"],
            ["src/b.py"],
        ]


def test_a_bound_file_wakes_its_session_when_its_content_changes() -> None:
    with running() as d:
        (d.root / "rates.csv").write_text("rate,1\n")
        spec = (
            f'name = "payroll"\n[run]\nexec = ["sh", "-c", "{RECORD}"]\ncwd = "."\n'
            '[bind]\nfiles = ["rates.csv"]\n'
        )
        d.ctl("create", str(d.write_spec("payroll", spec)), check=True)
        assert d.json("show", "payroll")["state"] == "sleeping"  # [bind] arms it
        (d.root / "rates.csv").write_text("rate,2\n")
        finished = wait_event(d, "payroll", "run.finished")
        assert finished["data"]["status"] == "ok"  # the gate let the cause of the wake through
        (cause,) = wakes(d.root)
        wake = cause["wakes"][0]
        assert (wake["trigger"], wake["details"]["paths"]) == ("dependency", ["rates.csv"])


def test_a_bound_file_linked_out_of_the_workspace_is_never_hashed_through_the_link() -> None:
    """The daemon (root, often) hashes bound files into the session's log: at create
    and at each run's start. A run may replace one by a link to a file it may not
    read; a hash of that file in its log would let it test guesses of a short secret
    offline. Read through no link out of the workspace: such a file has no hash."""
    outside = short_dir()
    key = outside / "key"
    key.write_text("4711\n")
    try:
        with running() as d:
            (d.root / "rates.csv").symlink_to(key)
            spec = (
                'name = "payroll"\n[run]\nexec = ["true"]\ncwd = "."\n'
                '[bind]\nfiles = ["rates.csv"]\n'
            )
            d.ctl("create", str(d.write_spec("payroll", spec)), check=True)
            at_create = wait_event(d, "payroll", "binding.observed")
            assert at_create["data"]["hashes"] == {"rates.csv": None}

            (d.root / "rates.csv").unlink()
            (d.root / "rates.csv").write_text("rate,1\n")  # its own file: hashed
            first = wait_event(d, "payroll", "run.finished")  # the change woke it
            (d.root / "rates.csv").unlink()
            (d.root / "rates.csv").symlink_to(key)  # and out again, while it sleeps
            d.ctl("activate", "payroll", check=True)
            # the gate judges the bound file (changed: not the cause of this wake)
            second = wait_event(d, "payroll", "gate.evaluated", since=first["seq"] + 1)
            log = (d.state_dir / "sessions" / "payroll" / "events.jsonl").read_text()
            assert hashlib.sha256(key.read_bytes()).hexdigest() not in log, second
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def test_a_commit_touching_the_paths_wakes_a_git_session_and_others_do_not() -> None:
    with running() as d:
        repo = d.root / "repo"
        (repo / "src").mkdir(parents=True)
        _git(repo, "init", "-q", "-b", "main")
        (repo / "src" / "api.py").write_text("def f(): pass\n")
        (repo / "README.md").write_text("hello\n")
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", "first")
        spec = (
            f'name = "docs"\n[run]\nexec = ["sh", "-c", "{RECORD}"]\ncwd = "repo"\n'
            '[[trigger]]\ntype = "git"\npaths = ["src/**"]\n'
        )
        d.ctl("create", str(d.write_spec("docs", spec)), check=True)
        (repo / "README.md").write_text("hello again\n")
        _git(repo, "commit", "-q", "-am", "docs only")
        ignored = wait_line(d, "git.ignored")
        assert ignored["session"] == "docs"
        first = _git(repo, "rev-parse", "HEAD")
        (repo / "src" / "api.py").write_text("def f(): return 1\n")
        _git(repo, "commit", "-q", "-am", "api change")
        wait_event(d, "docs", "run.finished")
        head = _git(repo, "rev-parse", "HEAD")
        (cause,) = wakes(repo)
        details = cause["wakes"][0]["details"]
        assert details["range"] == f"{first}..{head}"
        assert details["paths"] == ["src/api.py"]
        assert details["forced"] is False
        # history rewritten, as a force push does: the ref jumps to a commit that is
        # not a descendant of the one the session last saw (one ref update)
        seq = d.json("show", "docs")["seq"]
        (repo / "src" / "new.py").write_text("x = 1\n")
        _git(repo, "add", "src/new.py")
        tree = _git(repo, "write-tree")
        rewritten = _git(repo, "commit-tree", tree, "-p", first, "-m", "rewritten")
        _git(repo, "update-ref", "refs/heads/main", rewritten)
        wait_event(d, "docs", "run.finished", since=seq + 1)
        last = wakes(repo)[-1]["wakes"][0]["details"]
        assert last["forced"] is True
        assert last["range"] == f"{head}..{rewritten}"
        assert "src/new.py" in last["paths"]


def test_a_commit_in_a_sha256_repository_wakes_a_git_session() -> None:
    with running() as d:
        repo = d.root / "repo"
        (repo / "src").mkdir(parents=True)
        try:
            _git(repo, "init", "-q", "-b", "main", "--object-format=sha256")
        except subprocess.CalledProcessError:
            pytest.skip("this machine's git cannot create a SHA-256 repository (git >= 2.29 can)")
        (repo / "src" / "api.py").write_text("def f(): pass\n")
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", "first")
        first = _git(repo, "rev-parse", "HEAD")
        assert len(first) == 64
        spec = (
            f'name = "docs"\n[run]\nexec = ["sh", "-c", "{RECORD}"]\ncwd = "repo"\n'
            '[[trigger]]\ntype = "git"\npaths = ["src/**"]\n'
        )
        d.ctl("create", str(d.write_spec("docs", spec)), check=True)
        (repo / "src" / "api.py").write_text("def f(): return 1\n")
        _git(repo, "commit", "-q", "-am", "api change")
        head = _git(repo, "rev-parse", "HEAD")
        wait_event(d, "docs", "run.finished")
        (cause,) = wakes(repo)
        details = cause["wakes"][0]["details"]
        assert details["range"] == f"{first}..{head}"
        assert details["paths"] == ["src/api.py"]
        assert details["forced"] is False
        assert not [line for line in d.lines if line.get("event") == "git.check_failed"]


def test_commits_made_while_the_daemon_was_down_wake_the_session_after_a_restart() -> None:
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        repo = root / "repo"
        (repo / "src").mkdir(parents=True)
        _git(repo, "init", "-q", "-b", "main")
        (repo / "src" / "api.py").write_text("def f(): pass\n")
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", "first")
        first = _git(repo, "rev-parse", "HEAD")
        spec = (
            f'name = "docs"\n[run]\nexec = ["sh", "-c", "{RECORD}"]\ncwd = "repo"\n'
            '[[trigger]]\ntype = "git"\npaths = ["src/**"]\n'
        )
        d.ctl("create", str(d.write_spec("docs", spec)), check=True)
        d.stop()  # no git wake yet: only the cursor knows where the scan starts
        (repo / "src" / "api.py").write_text("def f(): return 1\n")
        _git(repo, "commit", "-q", "-am", "made while the daemon was down")
        head = _git(repo, "rev-parse", "HEAD")
        d.start()
        wait_event(d, "docs", "run.finished")
        (cause,) = wakes(repo)
        assert cause["wakes"][0]["details"]["range"] == f"{first}..{head}"
        d.stop()
        d.start()  # the wake in the log covers that commit: nothing runs again
        # A commit the trigger ignores shows that a check ran after the restart, and
        # it covers every commit since where the scan starts: had that been before
        # the commit already handled, it would have woken the session instead.
        since = len(d.lines)
        (repo / "README.md").write_text("hello again\n")
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", "docs only")
        d.wait_line("git.ignored", since=since)
        assert len(wakes(repo)) == 1
        assert len(d.json("log", "docs", "--type", "wake.requested")) == 1
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def wait_line(d: Daemon, event: str, timeout: float = 20.0) -> dict[str, object]:
    """The daemon's own log line (the harness collects them as they come)."""
    return d.wait_line(event, timeout=timeout)


def test_a_wake_storm_runs_each_session_a_few_times_and_loses_no_change() -> None:
    with running() as d:
        sessions = 20
        for i in range(sessions):
            folder = d.root / f"w{i}"
            (folder / "data").mkdir(parents=True)
            spec = (
                f'name = "w{i}"\n[run]\nexec = ["sh", "-c", "{RECORD}"]\ncwd = "w{i}"\n'
                '[[trigger]]\ntype = "watch"\npaths = ["data/*"]\n'
            )
            d.ctl("create", str(d.write_spec(f"w{i}", spec)), check=True)
        written: dict[int, set[str]] = {i: set() for i in range(sessions)}
        start = time.monotonic()
        for n in range(2000):  # 2,000 changes in about a second
            i = n % sessions
            name = f"data/f{n // sessions}.txt"
            (d.root / f"w{i}" / name).write_text(str(n))
            written[i].add(name)
        elapsed = time.monotonic() - start

        def all_seen() -> bool:
            seen = {
                i: {
                    p
                    for w in wakes(d.root / f"w{i}")
                    for x in w["wakes"]
                    for p in x["details"].get("paths", [])
                }
                for i in range(sessions)
            }
            return all(written[i] <= seen[i] for i in range(sessions))

        wait_for(all_seen, timeout=120, what="every change to reach a run")  # none lost
        for i in range(sessions):
            runs = len(wakes(d.root / f"w{i}"))
            assert 1 <= runs <= int(elapsed / 0.2) + 3, (i, runs, elapsed)
