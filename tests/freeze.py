"""A whole process tree paused and resumed, as a VM pause or a cgroup freeze of a
node does: every process SIGSTOPped, later SIGCONTed. The tests' own processes
only: a tree is found from a root the test started."""

from __future__ import annotations

import contextlib
import os
import signal


def children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
    return found


def tree(root: int) -> list[int]:
    """``root`` and every process under it, parents before their children."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo += children(pid)
    return found


def state(pid: int) -> str:
    """/proc's state letter ('T' stopped, 'Z' a zombie), '' when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rfind(b")") + 2 :][:1].decode()


def stopped_or_dead(pid: int) -> bool:
    return state(pid) in ("T", "Z", "X", "")


def freeze(root: int) -> list[int]:
    """SIGSTOP ``root``'s whole tree, the root first (it forks nothing more once
    stopped), again until a walk finds nothing new (a process may fork while it
    is being stopped); the pids stopped, parents first."""
    stopped: list[int] = []
    while new := [p for p in tree(root) if p not in stopped]:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped += new
    return stopped


def frozen(pids: list[int]) -> bool:
    """Every one of them stopped by now (SIGSTOP is delivered asynchronously)."""
    return all(stopped_or_dead(p) for p in pids)


def thaw(pids: list[int]) -> None:
    """SIGCONT, the leaves first: the order in which a program resumes before its
    holder and its spawner can look at any clock (the worst case)."""
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def programs_of(daemon: int) -> list[int]:
    """A daemon's runs' own processes: everything under its spawner's holders
    (the programs, their sandboxes and children), parents first."""
    found: list[int] = []
    for spawner in children(daemon):
        if b"runs/spawner.py" in cmdline(spawner):
            for holder in children(spawner):
                found += tree(holder)[1:]
    return found
