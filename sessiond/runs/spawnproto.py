"""The messages between the daemon (runs/spawner_client.py) and the spawner process
(runs/spawner.py): one JSON object a packet on their socket, each way.

The daemon asks: ``spawn`` a run (its program, held until the daemon says go),
``term`` or ``kill`` one, ``fence`` every run at a deadline. The spawner tells:
its ``idle`` holder (ahead of the request that takes it), a run ``spawned`` or
``refused``, a run ``exited``.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


class SpawnerRequest(TypedDict):
    """What the daemon asks the spawner (the fields but ``op`` are the op's own)."""

    op: Literal["spawn", "term", "kill", "fence"]
    id: NotRequired[int]  # the run's request id (spawn, term, kill)
    at: NotRequired[float]  # fence: the deadline (time.monotonic())
    # spawn: the program, where and as whom it runs, and how it is held
    argv: NotRequired[list[str]]
    cwd: NotRequired[str]
    env: NotRequired[dict[str, str]]
    cgroup_procs: NotRequired[list[str]]  # the run's cgroups' cgroup.procs files
    user: NotRequired[list[int]]  # [uid, gid]
    sandboxed: NotRequired[bool]  # argv is bubblewrap's: its exit is the program's
    holder: NotRequired[int]  # the idle holder the daemon was told of


class SpawnerReply(TypedDict):
    """What the spawner tells the daemon."""

    op: Literal["idle", "spawned", "refused", "exited"]
    id: NotRequired[int]
    pid: NotRequired[int | None]  # idle, spawned: the holder (None: no idle holder)
    start: NotRequired[int | None]  # its start time, to tell pids apart
    error: NotRequired[str]  # refused: why
    status: NotRequired[int]  # exited: the wait status
