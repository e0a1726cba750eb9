"""Run cgroups through the real daemon (docs/design.md section 9).

``[run] max_processes`` is refused at create and reload where the daemon has no
pids controller, and taken where it has one. Where the daemon has cgroups (the
test run's own, tests/cgroups.sh), each run gets a group of its own that a
hostile fork bomb cannot grow past ``max_processes``, that is killed through
the kernel, and that is removed after the run, or swept by the next start-up
when the daemon died.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessiond.runs.cgroups import run_prefix
from tests.e2e.harness import Daemon, running, short_dir, wait_event, wait_for
from tests.e2e.test_supervision import marked, wait_gone
from tests.runs import cgroup_env

BOUNDED = 'name = "bounded"\n[run]\nexec = ["true"]\nmax_processes = 16\n'
FIX = "configure [run] pids_cgroup or run under systemd with Delegate=yes"


def test_create_refuses_max_processes_without_a_pids_controller() -> None:
    with running('[run]\ncgroup = "off"\n') as d:
        done = d.ctl("create", str(d.write_spec("bounded", BOUNDED)))
        assert done.returncode == 5, done.stderr
        assert "run.max_processes: max_processes needs a pids controller" in done.stderr
        assert '[run] cgroup is "off", and no [run] pids_cgroup is set' in done.stderr
        assert FIX in done.stderr
        assert d.json("ps") == []
        # the same spec without the bound is fine
        d.ctl("create", str(d.write_spec("free", BOUNDED.replace("max_processes = 16\n", ""))),
              check=True)  # fmt: skip


def test_reload_refuses_a_new_spec_with_max_processes_without_a_pids_controller() -> None:
    with running('specs = "specs"\n[run]\ncgroup = "off"\n') as d:
        (d.root / "specs").mkdir()
        (d.root / "specs" / "bounded.toml").write_text(BOUNDED)
        done = d.ctl("reload")
        assert done.returncode == 1
        assert "max_processes needs a pids controller" in done.stdout
        assert d.json("ps") == []


def test_reload_refuses_a_changed_spec_the_daemon_cannot_run_and_keeps_the_old_one() -> None:
    with running('specs = "specs"\n[run]\ncgroup = "off"\n') as d:
        (d.root / "specs").mkdir()
        path = d.root / "specs" / "bounded.toml"
        free = BOUNDED.replace("max_processes = 16\n", "")
        path.write_text(free)
        d.ctl("reload", check=True)
        stored = d.state_dir / "sessions" / "bounded" / "spec.toml"
        before = stored.read_text()
        path.write_text(BOUNDED)  # now with a bound this daemon cannot enforce
        done = d.ctl("reload")
        assert done.returncode == 1, done
        assert "run.max_processes: max_processes needs a pids controller" in done.stdout
        assert "the session keeps its current spec" in done.stdout
        assert stored.read_text() == before
        assert "max_processes" not in d.ctl("show", "bounded", check=True).stdout
        # a cwd that is not a folder is refused the same way
        path.write_text(free.replace('exec = ["true"]', 'exec = ["true"]\ncwd = "no-such"'))
        done = d.ctl("reload")
        assert done.returncode == 1, done
        assert "run.cwd" in done.stdout
        assert "is not a folder" in done.stdout
        assert stored.read_text() == before


def test_create_names_a_configured_cgroup_folder_that_is_missing() -> None:
    with running('[run]\ncgroup = "/sys/fs/cgroup/sessiond-no-such-folder"\n') as d:
        done = d.ctl("create", str(d.write_spec("bounded", BOUNDED)))
        assert done.returncode == 5
        assert "[run] cgroup: /sys/fs/cgroup/sessiond-no-such-folder is not a folder" in done.stderr


@pytest.mark.parametrize("layout", cgroup_env.layouts(bounding=True))
def test_create_takes_max_processes_where_the_daemon_has_a_pids_controller(layout: str) -> None:
    for folders in cgroup_env.make_folders():
        run = folders.config(layout).run
        config = f'[run]\ncgroup = "{run.cgroup}"\n'
        if run.pids_cgroup is not None:
            config += f'pids_cgroup = "{run.pids_cgroup}"\n'
        with running(config) as d:
            d.ctl("create", str(d.write_spec("bounded", BOUNDED)), check=True)
            stored = (d.state_dir / "sessions" / "bounded" / "spec.toml").read_text()
            assert "max_processes = 16" in stored


# At most FORKS sleepers (bounded even if the limit failed), each ignoring SIGTERM
# (a stop then needs the kill); the count of forks that succeeded goes to a file.
FORKS = 300
FORK_BOMB = (
    "import os, signal, sys, time\n"
    "n = 0\n"
    f"for _ in range({FORKS}):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "        time.sleep(1000)\n"
    "        os._exit(0)\n"
    "    n += 1\n"
    "with open(sys.argv[2] + '.tmp', 'w') as f:\n"
    "    f.write(str(n))\n"
    "os.rename(sys.argv[2] + '.tmp', sys.argv[2])\n"
    "if sys.argv[3] == 'stays':\n"
    "    time.sleep(1000)\n"
)
LIMIT = 20


@pytest.fixture
def mark() -> Iterator[str]:
    """A unique marker; whatever carries it is killed at the end, pass or fail."""
    m = f"marker-{uuid.uuid4().hex}"
    yield m
    for pid in marked(m):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def daemon_config(folders: cgroup_env.Folders, layout: str) -> str:
    run = folders.config(layout).run
    config = f'[run]\ncgroup = "{run.cgroup}"\n'
    if run.pids_cgroup is not None:
        config += f'pids_cgroup = "{run.pids_cgroup}"\n'
    return config


def job(argv: list[str], extra: str = "") -> str:
    quoted = ", ".join(json.dumps(a) for a in argv)
    return (
        f'name = "job"\n[run]\nexec = [{quoted}]\ncwd = "."\nretries = 0\n{extra}'
        '[[trigger]]\ntype = "message"\n'
    )


def run_groups(folders: cgroup_env.Folders, d: Daemon) -> list[Path]:
    """The daemon's run groups in the test's folders (named by its state dir)."""
    prefix = run_prefix(d.state_dir)
    return [
        group
        for top in (folders.cgroup2, folders.pids)
        if top is not None
        for group in top.iterdir()
        if group.name.startswith(prefix)
    ]


@pytest.mark.parametrize("how", ["exits", "cancel"])
@pytest.mark.parametrize("layout", cgroup_env.layouts(bounding=True))
def test_a_fork_bomb_stops_at_max_processes_and_nothing_of_it_is_left(
    layout: str, how: str, mark: str
) -> None:
    for folders in cgroup_env.make_folders():
        fork_bomb(folders, layout, how, mark)


def fork_bomb(folders: cgroup_env.Folders, layout: str, how: str, mark: str) -> None:
    with running(daemon_config(folders, layout)) as d:
        count = d.root / "forks"
        stays = "stays" if how == "cancel" else "exits"
        argv = ["python3", "-c", FORK_BOMB, mark, str(count), stays]
        d.ctl("create", str(d.write_spec("job", job(argv, f"max_processes = {LIMIT}\n"))),
              check=True)  # fmt: skip
        d.ctl("activate", "job", check=True)
        text = wait_for(lambda: count.exists() and count.read_text(), what="the fork count")
        # the program is one of the LIMIT processes; the holder is not counted
        assert int(text) == LIMIT - 1, f"{text} forks succeeded (max_processes = {LIMIT})"
        if how == "cancel":
            d.ctl("cancel", "job", check=True, timeout=60)
        done = wait_event(d, "job", "run.finished")["data"]
        # cancelled: the leader dies of the SIGTERM, its children (which ignore
        # it) of the kill after the grace
        assert done["status"] == ("ok" if how == "exits" else "interrupted"), done
        wait_gone(mark)
        assert run_groups(folders, d) == []


@pytest.mark.parametrize("layout", cgroup_env.layouts(bounding=False))
def test_each_run_has_a_cgroup_of_its_own_removed_after_it(layout: str, tmp_path: Path) -> None:
    for folders in cgroup_env.make_folders():
        own_group(folders, layout, tmp_path)


def own_group(folders: cgroup_env.Folders, layout: str, tmp_path: Path) -> None:
    if layout == "none":
        cgroup_env.need("this machine offers no cgroup layout")
    with running(daemon_config(folders, layout)) as d:
        seen = tmp_path / "cgroup"
        argv = ["sh", "-c", f"cat /proc/self/cgroup > {seen}.tmp && mv {seen}.tmp {seen}"]
        # (outside its workspace: declared, or the sandbox keeps the run from it)
        extra = f"writable = [{json.dumps(str(tmp_path))}]\n"
        d.ctl("create", str(d.write_spec("job", job(argv, extra))), check=True)
        d.ctl("activate", "job", check=True)
        assert wait_event(d, "job", "run.finished")["data"]["status"] == "ok"
        name = f"{run_prefix(d.state_dir)}job.r1"
        lines = seen.read_text().splitlines()
        if layout != "v1":
            assert any(x.startswith("0::") and x.endswith(f"/{name}") for x in lines), lines
        if layout != "cgroup2":
            assert any(":pids:" in x and x.endswith(f"/{name}") for x in lines), lines
        wait_for(lambda: run_groups(folders, d) == [], what="the run's group removed")


@pytest.mark.parametrize("layout", cgroup_env.layouts(bounding=False))
def test_a_restart_removes_the_run_cgroups_a_dead_daemon_left(layout: str, mark: str) -> None:
    for folders in cgroup_env.make_folders():
        if layout == "none":
            cgroup_env.need("this machine offers no cgroup layout")
        root = short_dir()
        d = Daemon(root, daemon_config(folders, layout))
        try:
            d.start()
            argv = ["python3", "-c", "import time; time.sleep(1000)", mark]
            d.ctl("create", str(d.write_spec("job", job(argv))), check=True)
            d.ctl("activate", "job", check=True)
            wait_for(lambda: marked(mark), what="the program")
            assert run_groups(folders, d) != []
            assert d.proc is not None
            os.kill(d.proc.pid, signal.SIGKILL)  # the daemon only; its spawner follows
            d.stop()
            wait_gone(mark)
            assert run_groups(folders, d) != []  # nobody removed it: the daemon died
            d.start()
            # r1's group is gone. The restart may already have resumed the cut-off
            # session (its resume rule reruns it after the gate): r2 runs in a group
            # of its own, made by this daemon, which is not a leftover.
            assert [g for g in run_groups(folders, d) if not g.name.endswith(".r2")] == []
            assert [e["data"]["status"] for e in d.json("log", "job", "--type", "run.finished")][
                :1
            ] == ["lost"]
            d.stop()
        finally:
            if d.proc is not None and d.proc.poll() is None:
                d.stop(signal.SIGKILL)
            shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("layout", cgroup_env.layouts(bounding=False))
def test_a_shutdown_stops_a_run_in_its_cgroup_and_removes_the_group(layout: str, mark: str) -> None:
    for folders in cgroup_env.make_folders():
        shutdown(folders, layout, mark)


def shutdown(folders: cgroup_env.Folders, layout: str, mark: str) -> None:
    if layout == "none":
        cgroup_env.need("this machine offers no cgroup layout")
    root = short_dir()
    d = Daemon(root, daemon_config(folders, layout))
    try:
        d.start()
        # a child that ignores SIGTERM and keeps the pipes: only the kill ends it
        ignores = (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"
        )
        argv = ["sh", "-c", f"python3 -c '{ignores}' {mark} & exec sleep 1000"]
        d.ctl("create", str(d.write_spec("job", job(argv))), check=True)
        d.ctl("activate", "job", check=True)
        wait_for(lambda: marked(mark), what="the program's child")
        assert run_groups(folders, d) != []
        assert d.stop() == 0
        wait_gone(mark)
        assert run_groups(folders, d) == []
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop(signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("layout", cgroup_env.layouts(bounding=False))
def test_a_compaction_command_has_a_cgroup_of_its_own_removed_after_it(layout: str) -> None:
    """A ``[compact] exec`` command runs like a run: in a group of its own."""
    for folders in cgroup_env.make_folders():
        compaction_group(folders, layout)


def compaction_group(folders: cgroup_env.Folders, layout: str) -> None:
    if layout == "none":
        cgroup_env.need("this machine offers no cgroup layout")
    with running(daemon_config(folders, layout)) as d:
        # its summary is its cgroup: confined (a private /tmp, no file of the test's
        # to write), it tells what it saw the one way a compaction command does
        argv = ["sh", "-c", "cat /proc/self/cgroup"]
        spec = f'name = "notes"\n[compact]\nexec = {json.dumps(argv)}\n'
        d.ctl("create", str(d.write_spec("notes", spec)), check=True)
        for text in ("one", "two"):
            d.ctl("send", "notes", text, check=True)
        d.ctl("compact", "notes", "--keep", "0", check=True)
        prefix = f"/{run_prefix(d.state_dir)}notes.compact-"
        (compacted,) = d.json("log", "notes", "--type", "context.compacted")
        lines = compacted["data"]["summary"].splitlines()
        if layout != "v1":
            assert any(x.startswith("0::") and prefix in x for x in lines), lines
        if layout != "cgroup2":
            assert any(":pids:" in x and prefix in x for x in lines), lines
        # the answer came once the command was gone and its group removed
        assert run_groups(folders, d) == []
