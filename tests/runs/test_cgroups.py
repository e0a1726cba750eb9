"""Run cgroups on real cgroups: made, joined, killed, bounded, swept, removed.

Every group lives in a folder this test run made (tests/runs/cgroup_env.py);
each test is run for every layout the machine offers (cgroup2, the v1 pids
hierarchy, cgroup2 with v1 pids).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessiond.config import DaemonConfig, RunConfig
from sessiond.runs.cgroups import (
    LEAF,
    BadCgroupConfig,
    CgroupError,
    RunCgroup,
    detect,
    probe,
    run_prefix,
    sweep,
)
from tests.runs import cgroup_env
from tests.runs.cgroup_env import Folders, exited, held, read_lines, release

KILLING = cgroup_env.layouts(bounding=False)
BOUNDING = cgroup_env.layouts(bounding=True)


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture
def folders() -> Iterator[Folders]:
    yield from cgroup_env.make_folders()


# The leader, a child that keeps running, and a grandchild that left by a double
# fork into its own session (setsid): each writes its pid, then waits forever.
TREE = r"""
import os, signal, sys
def note():
    sys.stdout.write(f"{os.getpid()}\n"); sys.stdout.flush()
note()
if os.fork() == 0:
    note(); signal.pause()
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid(); note(); signal.pause()
    os._exit(0)
os.wait()  # the middle one: its child is orphaned now
signal.pause()
"""


@pytest.mark.parametrize("layout", KILLING)
def test_kill_stops_a_process_tree_with_a_double_forked_setsid_grandchild(
    folders: Folders, layout: str
) -> None:
    support = folders.support(layout)
    cg = RunCgroup.create(support, "sessiond-t-tree.r1", None)
    with held(sys.executable, "-c", TREE) as proc:
        cg.attach(proc.pid)
        release(proc)
        pids = [int(p) for p in read_lines(proc, 3)]
        fds = [os.pidfd_open(p) for p in pids]
        assert pids[0] == proc.pid  # the holder exec'd the program: the leader
        orphan = [p for p in pids[1:] if parent_of(p) != proc.pid]
        assert len(orphan) == 1  # the grandchild left the leader's tree by the double fork
        # and its session: a kill of the leader's process group would miss it
        assert os.getsid(orphan[0]) == orphan[0] != os.getsid(proc.pid)
        assert set(pids) <= set(cg.procs())
        cg.kill()
        assert cg.procs() == []
        assert exited(fds), "a process of the run outlived kill()"
        assert proc.wait(10) == -signal.SIGKILL
        cg.remove()
        assert all(not f.exists() for f in cg.folders)
        for fd in fds:
            os.close(fd)


# Forks until the kernel says no (EAGAIN), at most 100 times; reports how many it
# made and why it stopped, then waits to be killed.
BOMB = r"""
import os, signal
made = 0
while made < 100:
    try:
        pid = os.fork()
    except BlockingIOError:
        print(f"{made} EAGAIN", flush=True)
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    made += 1
else:
    print(f"{made} unbounded", flush=True)
signal.pause()
"""


@pytest.mark.parametrize("layout", BOUNDING)
def test_max_processes_bounds_a_fork_bomb_and_kill_cleans_it_up(
    folders: Folders, layout: str
) -> None:
    support = folders.support(layout)
    assert support.has_pids, support.pids_note
    cg = RunCgroup.create(support, "sessiond-t-bomb.r1", 8)
    with held(sys.executable, "-c", BOMB) as proc:
        cg.attach(proc.pid)
        release(proc)
        made, why = read_lines(proc, 1)[0].split()
        assert why == "EAGAIN"
        assert int(made) + 1 == 8  # the leader and 7 children, never more
        assert len(cg.procs()) == 8
        bounded = next(g for k, g in cg.groups if k == support.pids)
        peak = bounded / "pids.peak"
        if peak.exists():  # the kernel's own high-water mark (Linux 6.1+)
            assert int(peak.read_text()) <= 8
        cg.kill()
        assert cg.procs() == []
        assert proc.wait(10) == -signal.SIGKILL
        cg.remove()


def test_max_processes_needs_a_pids_controller_to_make_a_group(folders: Folders) -> None:
    if folders.cgroup2 is None:
        cgroup_env.need("no cgroup2 folder")
    # The test's folder gives its children no controller: a group below it has none.
    bare = folders.cgroup2 / "bare"
    bare.mkdir()
    support = detect(DaemonConfig(run=RunConfig(cgroup=str(bare))))
    assert support is not None
    assert not support.has_pids
    assert f"the cgroup2 folder {bare} has no pids controller" in support.pids_note
    with pytest.raises(CgroupError, match="needs a pids controller"):
        RunCgroup.create(support, "sessiond-t-nopids.r1", 4)
    assert not (bare / "sessiond-t-nopids.r1").exists()


# A daemon that makes a run's group, puts a program in it, prints the program's
# pid, and then dies (the test kills it with SIGKILL): the program keeps running.
DAEMON = r"""
import json, subprocess, sys
from sessiond.config import DaemonConfig
from sessiond.runs.cgroups import RunCgroup, detect
config = DaemonConfig.model_validate(json.loads(sys.argv[1]))
support = detect(config)
for name in sys.argv[2:]:
    cg = RunCgroup.create(support, name, None)
    child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    cg.attach(child.pid)
    print(child.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("layout", KILLING)
def test_sweep_stops_and_removes_what_a_dead_daemon_left(folders: Folders, layout: str) -> None:
    config = folders.config(layout)
    support = detect(config)
    assert support is not None
    mine, theirs = run_prefix(Path("/state/a")), run_prefix(Path("/state/b"))
    names = [f"{mine}one.r1", f"{mine}two.r3", f"{theirs}one.r1"]
    with subprocess.Popen(
        [sys.executable, "-c", DAEMON, config.model_dump_json(), *names],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as dead:
        left = [int(p) for p in read_lines(dead, 3)]
        dead.send_signal(signal.SIGKILL)
        assert dead.wait(10) == -signal.SIGKILL
    fds = [os.pidfd_open(p) for p in left]
    assert not exited(fds[:1], timeout=0)  # the dead daemon's programs still run

    assert sweep(support, mine) == sorted(names[:2])

    assert exited(fds[:2])
    for name in names[:2]:
        assert all(not (p / name).exists() for p in (support.cgroup2, support.pids_v1) if p)
    other = RunCgroup.existing(support, names[2])
    assert other.procs() == [left[2]]  # another daemon's run is left alone
    other.kill()
    other.remove()
    for fd in fds:
        os.close(fd)


def test_sweep_leaves_the_daemons_own_leaf_alone(folders: Folders) -> None:
    support = folders.support("cgroup2" if folders.cgroup2 else "v1")
    parent = support.cgroup2 or support.pids_v1
    assert parent is not None
    (parent / LEAF).mkdir()
    assert sweep(support, "dae") == []
    assert (parent / LEAF).is_dir()
    with pytest.raises(ValueError, match="needs a name prefix"):
        sweep(support, "")


def test_remove_refuses_a_group_with_processes_and_tolerates_one_gone(folders: Folders) -> None:
    support = folders.support("cgroup2" if folders.cgroup2 else "v1")
    cg = RunCgroup.create(support, "sessiond-t-busy.r1", None)
    with held("sleep", "1000") as proc:
        cg.attach(proc.pid)
        with pytest.raises(CgroupError, match="still has processes"):
            cg.remove()
        cg.kill()
        cg.remove()
        cg.remove()  # gone already: fine
        RunCgroup.create(support, "sessiond-t-twice.r1", None)
        with pytest.raises(CgroupError, match="exists already"):
            RunCgroup.create(support, "sessiond-t-twice.r1", None)


def test_detect_refuses_a_missing_folder_or_one_that_is_no_cgroup(tmp_path: Path) -> None:
    missing = DaemonConfig(run=RunConfig(cgroup=str(tmp_path / "missing")))
    with pytest.raises(BadCgroupConfig, match=r"\[run\] cgroup: .*missing is not a folder"):
        detect(missing)
    plain = DaemonConfig(run=RunConfig(cgroup=str(tmp_path)))
    with pytest.raises(BadCgroupConfig, match="is not a cgroup2 folder"):
        detect(plain)
    v1 = DaemonConfig(run=RunConfig(cgroup="off", pids_cgroup=tmp_path))
    with pytest.raises(BadCgroupConfig, match=r"pids_cgroup: .* is not a folder of a cgroup v1"):
        detect(v1)
    off = DaemonConfig(run=RunConfig(cgroup="off"))
    assert probe(off) == (None, '[run] cgroup is "off", and no [run] pids_cgroup is set')


DETECT = r"""
import json, os, sys
from sessiond.config import DaemonConfig
from sessiond.runs.cgroups import BadCgroupConfig, probe
if sys.argv[2:] == ["nobody"]:
    os.setuid(65534)  # root's powers over file modes go with its uid
try:
    support, note = probe(DaemonConfig.model_validate(json.loads(sys.argv[1])))
    print(json.dumps({"support": support and str(support.cgroup2), "note": note}))
except BadCgroupConfig as exc:
    print(json.dumps({"error": str(exc)}))
"""


def detect_elsewhere(
    config: DaemonConfig, *, powerless: bool = False, group: Path | None = None
) -> dict[str, str]:
    """``probe`` in another process: one without root's powers over file modes
    (it drops to nobody once its modules are loaded), or one inside ``group``."""
    argv = [sys.executable, "-c", DETECT, config.model_dump_json()]
    if group is None:
        if powerless and os.geteuid() == 0:
            argv.append("nobody")
        with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
            out, _ = proc.communicate(timeout=30)
    else:
        with held(*argv) as proc:  # in the group before it looks at its own
            (group / "cgroup.procs").write_text(str(proc.pid))
            release(proc)
            out, _ = proc.communicate(timeout=30)
    result: dict[str, str] = json.loads(out)
    return result


def test_detect_refuses_a_read_only_folder(folders: Folders) -> None:
    if folders.cgroup2 is None:
        cgroup_env.need("no cgroup2 folder")
    readonly = folders.cgroup2 / "ro"
    readonly.mkdir()
    readonly.chmod(0o555)
    config = DaemonConfig(run=RunConfig(cgroup=str(readonly)))
    # Root writes whatever the modes say: ask without its capabilities.
    found = detect_elsewhere(config, powerless=True)
    assert "is read-only for uid" in found["error"]
    assert "[run] cgroup:" in found["error"]


def test_auto_uses_the_daemons_own_group_only_when_it_is_delegated(folders: Folders) -> None:
    if folders.cgroup2 is None:
        cgroup_env.need("no cgroup2 folder")
    if cgroup_env.cgroup2_has_pids():  # the test's folder hands pids on to "service"
        (folders.cgroup2 / "cgroup.subtree_control").write_text("+pids")
    own = folders.cgroup2 / "service"
    own.mkdir()
    auto = DaemonConfig()
    if os.geteuid() == 0:  # a folder root made is root's, not delegated: not used
        found = detect_elsewhere(auto, group=own)
        assert found["support"] is None
        assert f"{own} is not delegated" in found["note"]
    os.setxattr(own, "user.delegate", b"1")  # what systemd's Delegate=yes sets
    found = detect_elsewhere(auto, group=own)
    assert found["support"] == str(own)
    assert found["note"] == ""
    if cgroup_env.cgroup2_has_pids():  # it moved itself out of the way of pids
        assert "pids" in (own / "cgroup.subtree_control").read_text().split()
        assert (own / LEAF).is_dir()
