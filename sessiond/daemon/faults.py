"""Test-only fault injection, built from the ``fault_*`` and ``record_synced`` keys
of the daemon configuration (all unset in production, where this adds nothing).

The fault tests (``tests/faults/``) drive the real daemon through them:

- ``fault_full_disk``: while the named file exists, every write to a session log
  fails with ENOSPC, the way a full file system answers;
- ``fault_state_dir``: the start-up probe of the state dir fails with EROFS or
  EACCES (a read-only mount; a folder the daemon may not write, which a test
  running as root cannot produce with permission bits);
- ``fault``: the daemon kills itself (SIGKILL) at the named point of a start, a
  settle or a hand-over (``ConfigFaults``, the runs floor's ``Faults``);
- ``fault_hold`` and ``fault_hold_until``: a start waits at the named point until
  the named file exists, so a race test can act while it is under way;
- ``record_synced``: each time a log is durable up to an offset, ``session
  offset`` is appended to the named file before any append up to there is
  acknowledged. After a kill -9 the power-cut simulation cuts every log back to
  its last recorded offset: what a machine that lost power would keep.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import structlog

from sessiond.config import DaemonConfig
from sessiond.log.store.durable import write_all
from sessiond.log.store.files import IOHooks
from sessiond.runs.faults import NO_FAULTS, Faults

log = structlog.get_logger(__name__)

# How often a hold looks for its file even when no change was reported: a
# backstop for a file made between the first look and the watch's start.
_RECHECK_MS = 1_000


def faults(config: DaemonConfig) -> Faults:
    """The fault points the configuration asks for (``NO_FAULTS`` without any)."""
    if config.fault is None and config.fault_hold is None:
        return NO_FAULTS
    return ConfigFaults(config.fault, config.fault_hold, config.fault_hold_until)


class ConfigFaults:
    """``Faults`` from the ``fault`` and ``fault_hold`` keys, read once at start-up."""

    def __init__(self, fault: str | None, hold: str | None, until: Path | None) -> None:
        self.fault = fault
        self.held = hold
        self.until = until

    def armed(self, point: str) -> bool:
        return point in (self.fault, self.held)

    def point(self, point: str) -> None:
        if self.fault == point:
            log.warning("fault.injected", point=point)
            os.kill(os.getpid(), signal.SIGKILL)

    async def hold(self, point: str, session: str) -> None:
        self.point(point)
        if self.held != point or self.until is None:
            return
        log.warning("fault.held", session=session, point=point, until=str(self.until))
        await released(self.until)
        log.warning("fault.released", session=session, point=point)


async def released(until: Path) -> None:
    """Return once ``until`` exists: woken by the file system's change
    notification on its folder (inotify), not by polling it."""
    if until.exists():
        return
    import watchfiles  # a fault held: tests only, not the daemon's start

    async for _ in watchfiles.awatch(
        until.parent, watch_filter=None, debounce=0, step=10, recursive=False,
        rust_timeout=_RECHECK_MS, yield_on_timeout=True,
    ):  # fmt: skip
        if until.exists():
            return


def io_hooks(config: DaemonConfig) -> IOHooks:
    """The log's system calls, with the configured faults (plain ones without)."""
    write = write_all
    if config.fault_full_disk is not None:
        marker = config.fault_full_disk

        def write(fd: int, data: bytes) -> None:
            if marker.exists():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            write_all(fd, data)

    synced = None
    if config.record_synced is not None:
        path = config.record_synced
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

        def synced(session: str, offset: int) -> None:
            # One small O_APPEND write: a kill -9 keeps it (the page cache survives
            # the process), and it is made before the appends are acknowledged.
            os.write(fd, f"{session} {offset}\n".encode())

    return IOHooks(write=write, synced=synced)


def probe_state_dir(config: DaemonConfig, state_dir: Path) -> None:
    """Fail the start-up write probe the way the configured fault says."""
    if config.fault_state_dir is not None:
        code = getattr(errno, config.fault_state_dir)
        raise OSError(code, os.strerror(code), str(state_dir))
