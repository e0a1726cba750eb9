"""The one exception hierarchy of sessiond.

Every error has a stable ``code`` (part of the wire format: RPC errors carry it)
and the ``sessionctl`` exit code it maps to (docs/design.md section 3). Messages name
the thing that was wrong and what to do about it.
"""

from __future__ import annotations

from collections.abc import Callable

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing is not imported at run time: the early server's path)
    from typing import ClassVar


class SessiondError(Exception):
    """Root of every error sessiond raises on purpose."""

    code: ClassVar[str] = "internal"
    exit_code: ClassVar[int] = 70


# --- refused (exit 1) -----------------------------------------------------------


class Refused(SessiondError):
    """The request was understood and is not allowed in the current state."""

    code = "refused"
    exit_code = 1


class AlreadyExists(Refused):
    """A session (or file) of that name exists already."""

    code = "already_exists"


class LogLocked(Refused):
    """Another writer holds the log's lock (one writer per log)."""

    code = "log_locked"


class FellBehind(Refused):
    """A ``log --follow`` reader fell further behind than the daemon buffers for it.

    The daemon ends that stream with this error rather than drop events silently or
    grow without bound; ``last_seq`` names, per session, the seq up to which every
    event was sent (or did not match), so the client can read the rest from the log
    (sessionctl does) and follow again.
    """

    code = "fell_behind"

    def __init__(self, message: str, last_seq: dict[str, int]) -> None:
        super().__init__(message)
        self.last_seq = last_seq


# --- invalid input (exit 5) -----------------------------------------------------


class InvalidInput(SessiondError):
    """Input from outside (a spec, a bundle, a value, a record) is not acceptable."""

    code = "invalid_input"
    exit_code = 5


class InvalidEvent(InvalidInput):
    """An event record does not match its type's schema."""

    code = "invalid_event"


class UnknownEventType(InvalidEvent):
    """An event's ``type`` is not one sessiond knows."""

    code = "unknown_event_type"


class UnsupportedVersion(InvalidEvent):
    """An event was written by a newer sessiond than this one."""

    code = "unsupported_version"


class BadArtifactRef(InvalidInput):
    """An artifact reference is not ``sha256:<64 hex>`` or names something outside the store."""

    code = "bad_artifact_ref"


class BadBundle(InvalidInput):
    """An export bundle is malformed, incomplete or fails its own checks."""

    code = "bad_bundle"


class BadName(InvalidInput):
    """A session name does not match ``[a-z0-9][a-z0-9._-]{0,63}``."""

    code = "bad_name"


# --- no such thing (exit 4) -----------------------------------------------------


class NoSuchSession(SessiondError):
    """No session of that name exists."""

    code = "no_such_session"
    exit_code = 4


# --- not reachable (exit 3) -------------------------------------------------------


class NodeUnavailable(SessiondError):
    """A cluster: the node that owns a session did not answer a request carried to
    it (down and not taken over, or died while carrying it out)."""

    code = "node_unavailable"
    exit_code = 3


# --- the cluster's database is not reachable (exit 6) -----------------------------


class DatabaseUnavailable(SessiondError):
    """A cluster: the PostgreSQL database the nodes share does not answer (stopped,
    restarting, unreachable). Nothing was done; the same request works again once
    it is back. A node ends (exit 75) when it cannot renew its lease meanwhile, and
    its supervisor starts it again."""

    code = "database_unavailable"
    exit_code = 6


# --- storage ----------------------------------------------------------------------


class StorageError(SessiondError):
    """The state dir cannot be read or written as needed."""

    code = "storage"
    exit_code = 70


class LogCorrupt(StorageError):
    """A line that is not the last one fails its checksum or breaks seq order.

    Raised when a log is read; a corrupt log takes no appends until an operator
    restores it (``sessiond fsck`` names the line).
    """

    code = "log_corrupt"

    def __init__(self, path: str, line: int, offset: int, why: str) -> None:
        self.path = path
        self.line = line
        self.offset = offset
        self.why = why
        super().__init__(
            f"{path}: line {line} (byte {offset}) is corrupt: {why}; the log takes no "
            "appends until it is restored from a backup or the line is fixed by hand "
            "(run 'sessiond fsck' for a full report)"
        )


class LogFailed(StorageError):
    """A write or fsync of the log failed; the log refuses further appends.

    After a failed fsync the page cache can no longer be trusted (the data may be
    gone while the next fsync reports success), so the only safe answer is to
    stop writing and let a restart re-read what is really on disk.
    """

    code = "log_failed"


class HandedOver(LogFailed):
    """A cluster: the session went to another node while this request waited for
    it; nothing was written here. Asking again reaches it (any node's socket)."""

    code = "handed_over"
    exit_code = 1


class CommitLost(LogFailed):
    """A cluster: the database went away during a commit (stopped, restarting,
    unreachable). Whether it was written is known only when the log is opened
    again (a new claim and a replay); sessionctl exits 6, as for the database away."""

    code = "commit_lost"
    exit_code = 6


class StorageFull(StorageError):
    """The file system is full (ENOSPC) or over quota; nothing partial was kept."""

    code = "storage_full"


class ArtifactMissing(StorageError):
    """A referenced artifact is not in the session's store."""

    code = "artifact_missing"


class ArtifactCorrupt(StorageError):
    """An artifact's content does not match its hash."""

    code = "artifact_corrupt"


class Fenced(LogFailed):
    """A cluster node wrote to a session it no longer owns: its lease lapsed, or
    another node claimed the session (a newer epoch). Nothing was written."""

    code = "fenced"


# --- errors of optional parts, recognised ------------------------------------------

# How the optional parts' own exceptions become ours: a cluster node registers how
# to recognise its database's connection errors (psycopg is imported only there),
# and every catch-all asks here before it calls an exception a bug.
_recognisers: list[Callable[[BaseException], SessiondError | None]] = []


def recognise(how: Callable[[BaseException], SessiondError | None]) -> None:
    """Register ``how``: an exception it knows becomes the error it returns."""
    _recognisers.append(how)


def recognised(exc: BaseException) -> SessiondError | None:
    """The SessiondError ``exc`` stands for, if a registered part knows it."""
    for how in _recognisers:
        found = how(exc)
        if found is not None:
            return found
    return None
