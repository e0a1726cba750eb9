"""Small helpers that make files durable the way crash-consistency research says.

A new file is durable only once the file *and* the directory entry naming it are
on disk, so: write, fsync the file, rename into place, fsync the directory
(Pillai et al., "All File Systems Are Not Created Equal", OSDI 2014).
Everything in the state dir is owner-only: folders 0700, files 0600.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from sessiond.errors import StorageError

DIR_MODE = 0o700
FILE_MODE = 0o600


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) a real, owner-only folder; refuse a symlink."""
    existed = path.is_dir()
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise StorageError(f"{path} exists and is not a folder; move it away") from exc
    if not existed:
        fsync_dir(path.parent)  # the new entry is durable before anything is put in it
    real_dir(path)
    if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing is not imported at run time: the early server's path)
    from typing import TypeVar

    P = TypeVar("P", str, Path)


def real_dir(path: P) -> P:
    """``path`` if it is a folder and not a symlink (symlinks planted in the state dir
    could make the store read or write elsewhere)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    if stat.S_ISLNK(st.st_mode):
        raise StorageError(f"{path} is a symbolic link; the state dir must hold real folders only")
    if not stat.S_ISDIR(st.st_mode):
        raise StorageError(f"{path} is not a folder")
    return path


def write_all(fd: int, data: bytes) -> None:
    done = os.write(fd, data)
    if done < len(data):  # rare: a signal or a nearly full disk cut the write short
        view = memoryview(data)
        while done < len(data):
            done += os.write(fd, view[done:])


def write_durable(path: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically and durably (temp, fsync, rename, fsync dir)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def read_regular(path: str | Path, limit: int | None = None) -> bytes:
    """Read a regular file without following a symlink at its last component."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{path} is not a regular file")
        if limit is not None and st.st_size > limit:
            raise StorageError(f"{path} is {st.st_size} bytes, more than the {limit} allowed")
        # One read of the size fstat gave, and a byte more: a short read of a regular
        # file is its end, so a file that did not grow is read in one system call
        # (a start-up reads three small files a session; a read of a MB each, and
        # one more to see the end, cost twice as much).
        data = os.read(fd, st.st_size + 1)
        if len(data) <= st.st_size:
            return data
        chunks = [data]
        while True:  # it grew meanwhile: read on to its end, as before
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def planted_error(path: str | Path, exc: OSError) -> StorageError:
    """The error for a file of the state dir that O_NOFOLLOW would not open."""
    if exc.errno == errno.ELOOP:
        # A symlink planted in place of a log or spec could make the daemon read
        # (and append to) a file anywhere: it is refused, never followed.
        return StorageError(
            f"{path} is a symbolic link; the state dir must hold real files only: "
            "replace it with the file itself (or restore it from a backup)"
        )
    return StorageError(f"{path} cannot be opened: {exc.strerror or exc}")
