"""The daemon keeps what its runs leave: it is a child subreaper.

Every run process descends from the spawner and its run's holder, both
subreapers, so an orphan reparents to one of them. A run can kill both (a run
sharing the daemon's uid may signal them); its orphans would then reparent to
PID 1 and look like anybody's processes. With the daemon a subreaper too, they
reparent to the daemon instead: still in its tree, where the control socket's
check (sessiond.ipc.runpeer) finds them and refuses them as it refuses every
process the daemon started. Linux only (``PR_SET_CHILD_SUBREAPER``, 3.4+).

What the daemon adopts is not reaped when it exits: the daemon cannot tell an
adopted zombie from a child of its own that another part of it (subprocess,
the event loop) is about to wait for, and reaping that one would lose its exit
status. So it stays a zombie until the daemon exits. Adopted are only the
orphans of processes the daemon started outside the spawner's care: a dead
spawner's runs and holders, and what a command the daemon runs itself leaves
behind. A zombie is never an operator either.
"""

from __future__ import annotations

import ctypes

import structlog

log = structlog.get_logger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants; False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        done = bool(libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        done = False
    if not done:
        log.warning("subreaper.unavailable", errno=ctypes.get_errno())
    return done
