"""The kernel's side of run cgroups: where the hierarchies are mounted, which
group a process is in, the interface files, and pidfds to kill and wait on.
No policy: sessiond.runs.cgroups decides what to make and when. Standard
library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["cgroup2", "v1"]  # cgroup2, or the cgroup v1 pids hierarchy


@dataclass(frozen=True)
class Mount:
    root: str  # the hierarchy's path mounted here (mountinfo field 4)
    point: Path
    fstype: str
    options: frozenset[str]


def mounts() -> list[Mount]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 6 or len(rest) < 3:
                continue
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            opts = frozenset(rest[2].split(",")) | frozenset(fields[5].split(","))
            out.append(Mount(fields[3], Path(point), rest[0], opts))
    return out


def mount_of(path: Path, kind: Kind) -> Mount | None:
    """The cgroup2 (or v1 pids) mount ``path`` lies in; the innermost one wins."""
    best: Mount | None = None
    for m in mounts():
        fits = m.fstype == "cgroup2" if kind == "cgroup2" else m.fstype == "cgroup"
        if kind == "v1":
            fits = fits and "pids" in m.options
        deeper = best is None or len(m.point.parts) > len(best.point.parts)
        if fits and path.is_relative_to(m.point) and deeper:
            best = m
    return best


def writable(path: Path) -> bool:
    return os.access(path, os.W_OK) and os.access(path / "cgroup.procs", os.W_OK)


def group_of(pid: int, mount: Mount) -> Path | None:
    """The cgroup2 folder ``pid`` is in, as a path under ``mount``."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            line = next((x for x in f if x.startswith("0::")), None)
    except OSError:
        return None
    if line is None:
        return None
    path = line[3:].rstrip("\n")
    if path.endswith(" (deleted)"):
        return None
    root = mount.root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    return mount.point / path[len(root) :].lstrip("/")


def delegated(path: Path) -> bool:
    for attr in ("user.delegate", "trusted.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, attr) == b"1":
                return True
    with contextlib.suppress(OSError):
        return os.geteuid() != 0 and path.stat().st_uid == os.geteuid()
    return False


def words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def has_cgroup_kill(folder: Path) -> bool:
    if (folder / "cgroup.kill").exists():
        return True
    # A hierarchy's root has no cgroup.kill of its own, its children do (Linux 5.14+).
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return release is not None and (int(release[1]), int(release[2])) >= (5, 14)


def kill_member(pid: int, members: list[tuple[str, str]]) -> int | None:
    """SIGKILL ``pid`` if it is still in the run's group; its pidfd, to wait on.

    The pidfd pins the process: a pid that exited and was taken by another
    process after the list was read is not in the group, and is left alone."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None  # gone already
    if not in_groups(pid, members):
        os.close(fd)
        return None
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    return fd


def in_groups(pid: int, members: list[tuple[str, str]]) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller, rel in members:
            named = controllers == "" if controller == "" else controller in controllers.split(",")
            if named and (path == rel or path.startswith(rel + "/")):
                return True
    return False


def wait_exited(fds: list[int], deadline: float) -> None:
    """Wait (bounded) until every pidfd says its process has exited."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    left = len(fds)
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        for fd, _ in poller.poll(remaining * 1000):
            poller.unregister(fd)
            left -= 1
