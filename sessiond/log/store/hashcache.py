"""Content hashes of files, remembered while the files do not change.

The resume gate checks that every artifact continuing needs still has its hash
(docs/design.md section 9). Reading a thousand artifacts at every wake would make the
gate cost what the artifacts weigh; a file whose inode, size, mtime and ctime
are what they were when it was hashed has not been written since, so its hash
is reused. ctime is in the key because a writer can put mtime back (``touch
-r``) but not ctime.

One catch, the one git calls "racy": file times have a coarse granularity (a
kernel tick), so a write just after hashing may leave all four unchanged. A hash
taken less than ``RACY_NS`` after the file's last change is therefore not
remembered; the file is read again next time, until it has been still for long
enough. Artifacts are written once, so in practice each is read once or twice.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterable

from sessiond.codec import Clock

# Longer than any file-time granularity Linux file systems use (a tick: 1-10 ms).
RACY_NS = 100_000_000
BLOCK = 1 << 20

# A file is known by (device, inode); what it held is trusted while its size,
# mtime and ctime are those it had when it was hashed.
Ident = tuple[int, int]
Stamp = tuple[int, int, int]


class NotRegularFile(OSError):
    """The path is a symlink, a folder or a device, never an artifact."""


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class HashCache:
    """sha256 of files, re-read only when a file changed (see above).

    ``read`` is ``os.read`` (tests count the reads through it); ``limit`` bounds
    how many files are remembered (the oldest entries go first)."""

    def __init__(
        self,
        *,
        read: Callable[[int, int], bytes] = os.read,
        clock: Clock = time.time_ns,
        limit: int = 200_000,
    ) -> None:
        self._read = read
        self._clock = clock
        self._limit = limit
        self._entries: dict[Ident, tuple[Stamp, str]] = {}

    def mismatches(
        self, expected: Iterable[tuple[str, str]], *, dir_fd: int | None = None
    ) -> dict[str, tuple[str, int] | OSError]:
        """Check files against the hex sha256 each should have: for each ``(path,
        digest)`` whose file does not hold it, what it holds now (digest, size) or
        why it cannot be read. Paths are relative to ``dir_fd`` if given."""
        # The hot loop of every gate, written flat: an unchanged file costs one
        # stat and a dict lookup (a call per file would cost about as much again).
        found: dict[str, tuple[str, int] | OSError] = {}
        lstat = os.stat
        known = self._entries.get
        regular = stat.S_ISREG
        for path, digest in expected:
            try:
                st = lstat(path, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                found[path] = exc
                continue
            hit = known((st.st_dev, st.st_ino))
            if (
                hit is not None
                and hit[1] == digest
                and hit[0] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                and regular(st.st_mode)
            ):
                continue
            try:
                now = self.sha256(path, dir_fd=dir_fd)
            except OSError as exc:
                found[path] = exc
                continue
            if now[0] != digest:
                found[path] = now
        return found

    def sha256(self, path: str, *, dir_fd: int | None = None) -> tuple[str, int]:
        """The hex sha256 and size of the regular file at ``path`` (relative to
        ``dir_fd`` if given; a symlink is never followed). Raises FileNotFoundError,
        NotRegularFile, OSError."""
        # One stat per file when nothing changed: with a folder's descriptor the
        # kernel resolves one name instead of the whole path (half the cost).
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        hit = self._entries.get((st.st_dev, st.st_ino))
        if hit is not None and hit[0] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            return hit[1], st.st_size
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            # The stamp of what is actually read (the file may have been swapped
            # since the stat): a change during the read shows at the next stat.
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(f"{path} is not a regular file")
            digest = hashlib.sha256()
            while block := self._read(fd, BLOCK):
                digest.update(block)
        finally:
            os.close(fd)
        hexdigest = digest.hexdigest()
        ident = (st.st_dev, st.st_ino)
        self._entries.pop(ident, None)
        if self._clock() - max(st.st_mtime_ns, st.st_ctime_ns) >= RACY_NS:
            if len(self._entries) >= self._limit:
                del self._entries[next(iter(self._entries))]
            self._entries[ident] = (_stamp(st), hexdigest)
        return hexdigest, st.st_size
