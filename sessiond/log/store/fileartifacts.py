"""A session's evidence as files: ``artifacts/<sha256 hex>``, content-addressed.

Separate from the log because artifacts are written once and never appended to:
each is a whole file made durable on its own (durable.py), named by its hash, and
checked against that hash on every read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from sessiond.errors import ArtifactCorrupt, ArtifactMissing, BadArtifactRef, StorageError
from sessiond.log.event_data import SHA256_HEX, SHA256_REF, ArtifactRef
from sessiond.log.store.base import ArtifactStore
from sessiond.log.store.durable import (
    FILE_MODE,
    fsync_dir,
    read_regular,
    real_dir,
    write_all,
    write_durable,
)
from sessiond.log.store.hashcache import HashCache, NotRegularFile


def _write_all_durable(folder: Path, files: dict[str, bytes]) -> None:
    """Write each file under a temporary name, sync them all, then rename them."""
    temps: list[tuple[Path, Path, int]] = []
    try:
        for digest, data in files.items():
            path = folder / digest
            tmp = folder / f".{digest}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
            temps.append((tmp, path, fd))
            write_all(fd, data)
        for _tmp, _path, fd in temps:
            os.fsync(fd)
        for tmp, path, _fd in temps:
            if path.is_symlink():
                path.unlink()
            os.replace(tmp, path)
    finally:
        for tmp, _path, fd in temps:
            os.close(fd)
            tmp.unlink(missing_ok=True)


class FileArtifacts(ArtifactStore):
    """The ``artifacts`` folder of one session: put, get (hash-checked), has, digests,
    verify (hash-checked, remembered while a file is unchanged: ``hashes``, which the
    store shares between the sessions' folders)."""

    def __init__(self, folder: Path, hashes: HashCache | None = None) -> None:
        self.folder = folder
        self.hashes = hashes if hashes is not None else HashCache()

    def _path(self, ref: str) -> Path:
        if not isinstance(ref, str) or not SHA256_REF.fullmatch(ref):
            raise BadArtifactRef(
                f"artifact reference {ref!r} is not valid: it must be 'sha256:' followed by "
                "64 lowercase hex digits"
            )
        return real_dir(self.folder) / ref[7:]

    def put(
        self, data: bytes, name: str, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        path = real_dir(self.folder) / digest
        try:
            st = os.lstat(path)
            present = stat.S_ISREG(st.st_mode) and st.st_size == len(data)
        except FileNotFoundError:
            present = False
        if present:
            # Reused: a gc leaves a file this fresh alone (sessiond.log.retention),
            # since the event naming it again is on its way.
            with contextlib.suppress(OSError):
                os.utime(path)
        else:
            if path.is_symlink():
                path.unlink()
            write_durable(path, data)
        return ArtifactRef(ref=f"sha256:{digest}", name=name, size=len(data), media_type=media_type)

    def put_many(self, items: Sequence[tuple[bytes, str, str]]) -> list[ArtifactRef]:
        # The parts of a model context: most are there already (touched, as put
        # does). The new ones are all written before any is synced, so the first
        # fsync's journal commit carries the others' data too (one commit, not one
        # a file), then renamed, then the folder synced once.
        folder = real_dir(self.folder)
        refs = []
        new: dict[str, bytes] = {}
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for data, name, media_type in items:
                digest = hashlib.sha256(data).hexdigest()
                refs.append(
                    ArtifactRef(
                        ref=f"sha256:{digest}", name=name, size=len(data), media_type=media_type
                    )
                )
                if digest in new:
                    continue
                try:
                    st = os.stat(digest, dir_fd=dir_fd, follow_symlinks=False)
                    present = stat.S_ISREG(st.st_mode) and st.st_size == len(data)
                except FileNotFoundError:
                    present = False
                if present:
                    with contextlib.suppress(OSError):
                        os.utime(digest, dir_fd=dir_fd, follow_symlinks=False)
                else:
                    new[digest] = data
            if new:
                _write_all_durable(folder, new)
                os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return refs

    def get(self, ref: str) -> bytes:
        path = self._path(ref)
        try:
            data = read_regular(path)
        except FileNotFoundError:
            raise ArtifactMissing(f"artifact {ref} is missing from {self.folder}") from None
        except OSError as exc:  # ELOOP: a symlink planted in place of an artifact
            raise ArtifactCorrupt(f"artifact {ref} cannot be read safely: {exc}") from exc
        except StorageError as exc:
            raise ArtifactCorrupt(f"artifact {ref}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != ref[7:]:
            raise ArtifactCorrupt(
                f"artifact {ref} in {self.folder} does not match its hash; restore it from a backup"
            )
        return data

    def verify(self, ref: str) -> str | None:
        return self.verify_many([ref]).get(ref)

    def verify_many(self, refs: Iterable[str]) -> dict[str, str]:
        # The gate asks this for every artifact a session needs, at every wake:
        # the folder is opened once (never through a symlink) and each artifact is
        # looked up in it by name, one stat each when nothing changed.
        refs = list(refs)
        try:
            dir_fd = os.open(
                self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError as exc:
            why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc})"
            return dict.fromkeys(refs, f"the artifacts folder {self.folder} {why}")
        problems: dict[str, str] = {}
        names: list[tuple[str, str]] = []
        for ref in refs:
            if isinstance(ref, str) and SHA256_REF.fullmatch(ref):
                names.append((ref[7:], ref[7:]))  # content-addressed: the name is the hash
            else:
                problems[ref] = (
                    f"{ref!r} is not an artifact reference ('sha256:' and 64 lowercase hex digits)"
                )
        try:
            found = self.hashes.mismatches(names, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        for name, what in found.items():
            if isinstance(what, FileNotFoundError):
                problem = f"missing: there is no file artifacts/{name}"
            elif isinstance(what, NotRegularFile):
                problem = f"artifacts/{name} is not a regular file (a symlink or a folder)"
            elif isinstance(what, OSError):
                problem = f"artifacts/{name} cannot be read: {what}"
            else:
                problem = (
                    f"changed: the file now holds {what[1]} bytes that hash to sha256:{what[0]}"
                )
            problems["sha256:" + name] = problem
        return problems

    def has(self, ref: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self._path(ref)).st_mode)
        except FileNotFoundError:
            return False

    def digests(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(real_dir(self.folder)) if SHA256_HEX.fullmatch(n))
        except FileNotFoundError:
            return []

    def remove(self, refs: list[str]) -> None:
        folder = real_dir(self.folder)
        for ref in refs:
            (folder / self._path(ref).name).unlink(missing_ok=True)
        if refs:
            fsync_dir(folder)

    def stats(self) -> dict[str, tuple[int, float]]:
        """Each regular file's size and mtime (a reuse touches it: see put)."""
        out: dict[str, tuple[int, float]] = {}
        for digest in self.digests():
            try:
                st = os.lstat(self.folder / digest)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[f"sha256:{digest}"] = (st.st_size, st.st_mtime)
        return out
