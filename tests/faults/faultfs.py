"""The fault file system: tests/faults/faultmodel.py served over FUSE (mfusepy over
Debian's libfuse3), so that a power cut loses what a real one would and the
daemon cannot fake what it fsynced.

    python -m tests.faults.faultfs MOUNTPOINT

serves until its standard input closes; each line read there is a command,
answered with one line: ``cut SEED`` (the power goes out: see faultmodel.py),
``sync`` (what sync(2) would do: it never reaches a FUSE server), ``ping``.
The kernel caches nothing (direct I/O, no attribute or entry cache), so what
the model holds after a cut is what every reader sees. Mounted by root, other
uids may use it too (``others``): it keeps owners, but no ACLs, and checks no
permissions.

``mounted(path)`` runs one for a test and unmounts it (``fusermount3 -u``) even
on failure; ``usable()`` says why one cannot be mounted here (None: it can).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from tests.faults.faultmodel import Model, Node, fail


class FaultFS:
    """mfusepy's Operations, path-based; one lock over the model (FUSE runs
    single-threaded, the control thread takes the lock for a cut)."""

    use_ns = True

    def __init__(self) -> None:
        self.model = Model()
        self._mutex = threading.Lock()
        self.handles: dict[int, Node] = {}
        self.next_fh = 1
        # Owners, by inode: metadata a power cut does not concern (kept apart from the
        # model). What is not here is the mounting user's. ``caller``: the uid and gid
        # of the request being served (the FUSE context, set by main()).
        self.owners: dict[int, tuple[int, int]] = {}
        self.caller: Callable[[], tuple[int, int]] = lambda: (os.getuid(), os.getgid())

    def _open(self, node: Node) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = node
        return fh

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh and fh in self.handles:
            return self.handles[fh]
        return self.model.lookup(path or "/")

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            node = self._node(path, fh)
            ns = int(node.mtime * 1e9)
            size = len(node.data)
            uid, gid = self.owners.get(node.ino, (os.getuid(), os.getgid()))
            return {
                "st_mode": node.mode, "st_ino": node.ino, "st_nlink": self.model.nlink(node),
                "st_size": size, "st_uid": uid, "st_gid": gid,
                "st_mtime": ns, "st_ctime": ns, "st_atime": ns, "st_blocks": size // 512 + 1,
            }  # fmt: skip

    def readdir(self, path: str, fh: int) -> list[str]:
        with self._mutex:
            return [".", "..", *self.model.lookup(path).entries]

    def access(self, path: str, amode: int) -> int:
        with self._mutex:
            self.model.lookup(path)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        big, half = 1 << 24, 1 << 23
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": big, "f_bfree": half,
                "f_bavail": half, "f_files": big, "f_ffree": half, "f_namemax": 255}  # fmt: skip

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            node = self.model.make(path, stat.S_IFDIR | (mode & 0o7777))
            self.owners[node.ino] = self.caller()
        return 0

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self._mutex:
            try:
                node = self.model.make(path, stat.S_IFREG | (mode & 0o7777))
                self.owners[node.ino] = self.caller()
            except OSError as exc:
                if exc.errno != errno.EEXIST or flags & os.O_EXCL:
                    raise
                node = self.model.lookup(path)
            return self._open(node)

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            node = self.model.lookup(path)
            if flags & os.O_TRUNC and node.data:
                self.model.truncate(node, 0)
            return self._open(node)

    def opendir(self, path: str) -> int:
        with self._mutex:
            return self._open(self.model.lookup(path))

    def release(self, path: str, fh: int) -> int:
        with self._mutex:
            self.handles.pop(fh, None)
        return 0

    def releasedir(self, path: str, fh: int) -> int:
        return self.release(path, fh)

    def flush(self, path: str, fh: int) -> int:
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            return bytes(self._node(path, fh).data[offset : offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            return self.model.write(self._node(path, fh), offset, data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self._mutex:
            self.model.truncate(self._node(path, fh), length)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            self.model.fsync(self._node(path, fh))
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return self.fsync(path, datasync, fh)

    def unlink(self, path: str) -> int:
        with self._mutex:
            self.model.unlink(path)
        return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            self.model.rmdir(path)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            self.model.rename(old, new)
        return 0

    def link(self, target: str, source: str) -> int:
        with self._mutex:
            self.model.link(source, target)
        return 0

    def symlink(self, target: str, source: str) -> int:
        with self._mutex:
            node = self.model.make(target, stat.S_IFLNK | 0o777, source.encode())
            self.owners[node.ino] = self.caller()
        return 0

    def readlink(self, path: str) -> str:
        with self._mutex:
            return self.model.lookup(path).data.decode()

    def chmod(self, path: str, mode: int) -> int:
        with self._mutex:
            node = self.model.lookup(path)
            node.mode = stat.S_IFMT(node.mode) | (mode & 0o7777)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        with self._mutex:
            node = self.model.lookup(path)
            old_uid, old_gid = self.owners.get(node.ino, (os.getuid(), os.getgid()))
            keep = (-1, 0xFFFFFFFF)  # chown(2)'s "leave it as it is"
            self.owners[node.ino] = (
                old_uid if uid in keep else uid,
                old_gid if gid in keep else gid,
            )
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self._mutex:
            node = self.model.lookup(path)
            node.mtime = times[1] / 1e9 if times else time.time()
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        raise fail(errno.EPERM)  # no sockets or devices: none are made here

    def control(self, stream: IO[str], out: IO[str]) -> None:
        """The control thread: commands on ``stream``, one answer each on ``out``."""
        for line in stream:
            words = line.split()
            if words[:1] == ["cut"]:
                with self._mutex:
                    self.model.cut(random.Random(int(words[1])))
                out.write("ok\n")
            elif words[:1] == ["sync"]:  # sync(2): every file and folder is durable
                with self._mutex:
                    for node in self.model.nodes.values():
                        self.model.fsync(node)
                out.write("ok\n")
            else:
                out.write("ok\n" if words[:1] == ["ping"] else f"unknown {line!r}\n")
            out.flush()
        os.kill(os.getpid(), 15)  # stdin closed: the controller is gone


def usable() -> str | None:
    """Why no fault file system can be mounted here (None: one can)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse cannot be opened"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: no libfuse3 for ctypes to load
        return f"mfusepy cannot load libfuse3 ({exc})"
    return None


class Mount:
    """A running fault file system at ``path``."""

    def __init__(self, path: Path, proc: subprocess.Popen[str]) -> None:
        self.path = path
        self.proc = proc

    def _ask(self, line: str) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if answer.strip() != "ok":
            raise RuntimeError(f"fault file system: {line!r} answered {answer!r}")

    def sync(self) -> None:
        """Everything durable, as sync(2) would make it."""
        self._ask("sync")

    def cut(self, seed: int) -> None:
        """The power goes out. Nothing may have a file open on it (kill first)."""
        self._ask(f"cut {seed}")


@contextlib.contextmanager
def mounted(path: Path, timeout: float = 30.0) -> Iterator[Mount]:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.faultfs", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not os.path.ismount(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fault file system did not mount at {path}")
            time.sleep(0.02)
        mount = Mount(path, proc)
        mount._ask("ping")
        yield mount
    finally:
        _unmount(path, proc)


def _unmount(path: Path, proc: subprocess.Popen[str]) -> None:
    for args in (["-u"], ["-u", "-z"]):  # lazily where something still holds it
        if not os.path.ismount(path):
            break
        subprocess.run(["fusermount3", *args, str(path)], capture_output=True, check=False)
    for stream in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            if stream is not None:
                stream.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def others() -> dict[str, bool]:
    """The mount options that let other uids in: a FUSE mount is by default the
    mounting user's alone, and a root daemon runs each session as a uid of its own
    (sessiond/runs/uids.py). Only root may say ``allow_other`` without
    ``user_allow_other`` in /etc/fuse.conf, and only a root daemon needs it. No
    ``default_permissions``: the file system checks no permission itself (it keeps
    no ACLs to check); what confines a run on it is the sandbox's mounts (read-only
    binds, hidden folders), which the kernel enforces on any file system. A root
    daemon opens a workspace on it to a run's uid by its mode bits (the campaign
    makes it 0777), a run's home by its owner (``FaultFS.owners``)."""
    return {"allow_other": True} if os.geteuid() == 0 else {}


def main(argv: list[str]) -> int:
    import mfusepy

    fs = FaultFS()
    fs.caller = lambda: mfusepy.fuse_get_context()[:2]
    threading.Thread(target=fs.control, args=(sys.stdin, sys.stdout), daemon=True).start()
    try:
        mfusepy.FUSE(
            fs, argv[0], foreground=True, nothreads=True, direct_io=True,
            attr_timeout=0, entry_timeout=0, negative_timeout=0, fsname="sessiond-faultfs",
            **others(),
        )  # fmt: skip
    except RuntimeError:  # unmounted under it (fusermount3 -u): the end it was waiting for
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
