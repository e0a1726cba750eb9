"""Is a session's open log still the file its daemon wrote? (docs/design.md section 9)

The resume gate's "log intact" check, for the files backend. The daemon knows
three things about the log it appends to that nobody else can change: the file
it opened (device and inode), where its own last line ends, and how far it has
already verified the lines. Three cheap checks follow from them:

- the path still names that file (a copy renamed over it would be read at the
  next start, while the daemon keeps appending to the old inode);
- the file is exactly as long as the daemon's end (shorter: cut behind its
  back; longer: someone else appended);
- every line after the last verified offset has a good checksum and the next
  seq, and the last one is the daemon's own last event (same seq, same id).

Only the bytes after the last verification are read, so a gate on a long log
costs a stat, an fstat and the lines written since the previous gate. Damage to
lines verified earlier is what ``sessiond fsck`` finds (it reads every line);
a restart verifies everything it reads, too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sessiond.log.store.base import LogPosition
from sessiond.log.store.lines import ScanEnd, scan

WHAT_TO_DO = (
    "stop the daemon, run 'sessiond fsck --state-dir DIR' and restore the log "
    "from a backup (or put the daemon's own file back)"
)


@dataclass(frozen=True, slots=True)
class LogIdentity:
    """The file a log's writer holds open."""

    dev: int
    ino: int


def identity_of(fd: int) -> LogIdentity:
    st = os.fstat(fd)
    return LogIdentity(st.st_dev, st.st_ino)


def check_log(
    path: Path, fd: int, own: LogIdentity, end: LogPosition, verified: LogPosition
) -> tuple[str | None, LogPosition]:
    """What is wrong with the log at ``path`` (None: nothing) and how far it is
    verified now. ``fd`` is the writer's descriptor, ``end`` where its last line
    ends, ``verified`` where the previous check (or recovery) stopped."""
    name = path.name
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return (
            f"{name} is gone: {path} no longer exists (the daemon appended to inode "
            f"{own.ino}); {WHAT_TO_DO}",
            verified,
        )
    if (st.st_dev, st.st_ino) != (own.dev, own.ino):
        return (
            f"{name} was replaced (inode {st.st_ino}, the daemon appended to {own.ino}): "
            f"the file at {path} is not the one this daemon wrote; {WHAT_TO_DO}",
            verified,
        )
    size = os.fstat(fd).st_size
    if size < end.offset:
        return (
            f"{name} is shorter than the daemon's end ({size} < {end.offset} bytes): "
            f"truncated behind the daemon's back (its last event is seq {end.seq}); "
            f"{WHAT_TO_DO}",
            verified,
        )
    if size > end.offset:
        return (
            f"{name} is longer than the daemon's end ({size} > {end.offset} bytes): "
            f"something else wrote to it; {WHAT_TO_DO}",
            verified,
        )
    if verified.offset >= end.offset:
        return None, verified

    def read(want: int, offset: int) -> bytes:
        # Never past the daemon's own end: what lies beyond is not its to vouch for.
        return os.pread(fd, max(0, min(want, end.offset - offset)), offset)

    stop = ScanEnd(verified)
    for _ in scan(read, verified, stop):
        pass
    got = stop.position
    if got.offset != end.offset:
        why = stop.tail_reason or "the line is cut short"
        if why == "checksum does not match":
            why = "fails its checksum"
        return (
            f"the line at seq {got.seq + 1} (byte {got.offset} of {name}) {why}: the log "
            f"was changed behind the daemon's back; {WHAT_TO_DO}",
            got,
        )
    if got.seq != end.seq or got.last_id != end.last_id:
        return (
            f"the last line of {name} is not the daemon's last event (seq {got.seq}, id "
            f"{got.last_id}; the daemon wrote seq {end.seq}, id {end.last_id}); {WHAT_TO_DO}",
            verified,
        )
    return None, got
