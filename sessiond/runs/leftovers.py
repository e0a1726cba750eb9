"""Finding a dead daemon's leftover processes by the marker in their environment.

Every process of a run inherits ``SESSIOND_RUN_MARK=<daemon id>:<session>:<run>``
(the daemon id names the state dir). The spawner is the real guarantee that
nothing outlives a dead daemon (it kills its whole subtree when the daemon's end
of its socket closes); this scan is the fallback for when the spawner died too
(both killed with SIGKILL at once, say). It is a fallback only: a program may
exec a child with an environment of its own, and that child no longer carries
the marker. Only processes of our own uid are looked at (the kernel lets us
read no one else's environment anyway).
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
from pathlib import Path

MARK = "SESSIOND_RUN_MARK"
PASSES = 20  # a leftover may fork while it is killed: look again, a bounded number of times


@functools.cache  # asked at every start: the state dir does not move
def daemon_id(state_dir: Path) -> str:
    """The state dir's id in the marker: one daemon per state dir."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]


def mark(state_dir: Path, session: str, run_id: str) -> str:
    return f"{daemon_id(state_dir)}:{session}:{run_id}"


def marked(state_dir: Path, run_uid: int | None = None) -> dict[int, str]:
    """Our uid's (and the [run] user's) processes carrying this state dir's marker:
    pid → the marker."""
    prefix = f"{MARK}={daemon_id(state_dir)}:".encode()
    me, uids = os.getpid(), {os.getuid(), run_uid}
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid not in uids:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue  # gone, or not ours to read
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                found[int(entry)] = item[len(MARK) + 1 :].decode(errors="replace")
                break
    return found


def kill_marked(state_dir: Path, run_uid: int | None = None) -> dict[int, str]:
    """SIGKILL every leftover of this state dir's runs; the ones that were found."""
    killed: dict[int, str] = {}
    for _ in range(PASSES):
        found = marked(state_dir, run_uid)
        found = {pid: m for pid, m in found.items() if not _zombie(pid)}
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        killed.update(found)
    return killed


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")
