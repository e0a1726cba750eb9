"""The state dir's checks before a daemon starts: it can be written, one daemon
holds it (``sessiond.lock``), the mask key is there, and the file limit is up
(every session keeps its log open). Each refusal says what to do."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import resource
from pathlib import Path

from sessiond.errors import SessiondError
from sessiond.log.store.durable import private_dir

# The early server takes the lock before the configuration is validated
# (sessiond.daemon.early): what the other checks need is imported by them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from sessiond.config import DaemonConfig


class StartupError(SessiondError):
    """The daemon cannot start; the message says why and what to do."""

    code = "startup"
    exit_code = 1


def check_writable(config: DaemonConfig) -> None:
    """Refuse to start on a state dir that cannot be written (read-only, no permission)."""
    from sessiond.daemon.faults import probe_state_dir

    state_dir = config.state_dir
    try:
        private_dir(state_dir)
        probe_state_dir(config, state_dir)
        probe = state_dir / f".probe-{os.getpid()}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"ok")
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        why = {
            errno.EROFS: "the file system is read-only",
            errno.EACCES: "permission denied",
            errno.ENOSPC: "the disk is full",
        }.get(exc.errno or 0, exc.strerror or str(exc))
        raise StartupError(
            f"cannot write to the state dir {state_dir}: {why}; give the daemon a writable "
            "folder with --state-dir or SESSIOND_STATE_DIR"
        ) from exc


def mask_key(config: DaemonConfig) -> None:
    """The daemon's mask key (sessiond.redaction): masked step keys are found again
    by it after a restart."""
    from sessiond.redaction import use_key_file

    try:
        use_key_file(config.state_dir / "redact.key")
    except OSError as exc:
        raise StartupError(f"cannot use the mask key: {exc}") from exc


def take_lock(state_dir: Path) -> int:
    """Hold ``sessiond.lock`` for the daemon's lifetime; say who holds it if taken."""
    path = state_dir / "sessiond.lock"
    try:
        # O_NOFOLLOW: the lock is truncated and given our pid; through a symlink
        # planted in its place that would overwrite a file anywhere we may write.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc})"
        raise StartupError(
            f"{path} {why}; the state dir must hold real files only: remove it and start again"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StartupError(
            f"another sessiond (pid {holder}) is using the state dir {state_dir}; one daemon "
            "per state dir: stop it, or give this one another --state-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def raise_file_limit() -> None:
    """Every session keeps its log open: take all the file descriptors we may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
