"""Test-only fault injection, built from the ``fault_*`` and ``record_synced`` keys
of the daemon configuration (all unset in production, where this adds nothing).

The fault tests (``tests/faults/``) drive the real daemon through them:

- ``fault_full_disk``: while the named file exists, every write to a session log
  fails with ENOSPC, the way a full file system answers;
- ``fault_state_dir``: the start-up probe of the state dir fails with EROFS or
  EACCES (a read-only mount; a folder the daemon may not write, which a test
  running as root cannot produce with permission bits);
- ``record_synced``: each time a log is durable up to an offset, ``session
  offset`` is appended to the named file before any append up to there is
  acknowledged. After a kill -9 the power-cut simulation cuts every log back to
  its last recorded offset: what a machine that lost power would keep.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from sessiond.config import DaemonConfig
from sessiond.log.store.durable import write_all
from sessiond.log.store.files import IOHooks


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
