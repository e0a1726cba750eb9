"""The fault file system's state: files and folders in memory, each with what is
durable (as of its last fsync) and what is not yet.

POSIX durability, strictly:

- a file's bytes are durable once the file is fsynced (``fsync``/``fdatasync``);
  the writes and truncates since are pending, in order;
- a folder's entries (create, mkdir, link, unlink, rmdir, rename in or out of
  it, symlink) are durable once the folder is fsynced; until then they are
  pending, in order. Fsyncing a file makes no entry durable.

``cut(rng)`` is the power going out: each file keeps its durable bytes plus a
random prefix of its pending writes (the last one kept may be torn: a random
prefix of its bytes); each folder keeps its durable entries plus a random subset
of its pending operations (applied in order); what no folder names is gone.
Everything left is then durable. No I/O here: tests/faults/faultfs.py serves it
over FUSE, and tests/faults/test_faultfs.py checks it against the rules above.
"""

from __future__ import annotations

import errno
import random
import stat
import time
from dataclasses import dataclass, field

Op = tuple[str, int, bytes]  # ("w", offset, data) | ("t", length, b"")
DirOp = tuple[str, str, int]  # ("add", name, ino) | ("del", name, 0)


def fail(code: int) -> OSError:
    return OSError(code, "")


@dataclass
class Node:
    ino: int
    mode: int
    data: bytearray = field(default_factory=bytearray)  # a file's bytes, a link's target
    durable: bytes = b""
    pending: list[Op] = field(default_factory=list)
    entries: dict[str, int] = field(default_factory=dict)  # a folder's
    durable_entries: dict[str, int] = field(default_factory=dict)
    pending_entries: list[DirOp] = field(default_factory=list)
    mtime: float = field(default_factory=time.time)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class Model:
    """The whole file system; paths are absolute ("/a/b")."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {1: Node(1, stat.S_IFDIR | 0o755)}
        self.next_ino = 2

    # --- lookups ----------------------------------------------------------------

    def lookup(self, path: str) -> Node:
        node = self.nodes[1]
        for part in [p for p in path.split("/") if p]:
            if not node.is_dir:
                raise fail(errno.ENOTDIR)
            ino = node.entries.get(part)
            if ino is None:
                raise fail(errno.ENOENT)
            node = self.nodes[ino]
        return node

    def parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        folder = self.lookup(head or "/")
        if not folder.is_dir:
            raise fail(errno.ENOTDIR)
        return folder, name

    def nlink(self, node: Node) -> int:
        if node.is_dir:
            return 2 + sum(1 for i in node.entries.values() if self.nodes[i].is_dir)
        return sum(
            1 for n in self.nodes.values() if n.is_dir for i in n.entries.values() if i == node.ino
        )

    # --- folder operations ------------------------------------------------------

    def _add(self, folder: Node, name: str, ino: int) -> None:
        folder.entries[name] = ino
        folder.pending_entries.append(("add", name, ino))
        folder.mtime = time.time()

    def _del(self, folder: Node, name: str) -> None:
        del folder.entries[name]
        folder.pending_entries.append(("del", name, 0))
        folder.mtime = time.time()

    def make(self, path: str, mode: int, target: bytes = b"") -> Node:
        folder, name = self.parent(path)
        if name in folder.entries:
            raise fail(errno.EEXIST)
        node = Node(self.next_ino, mode, bytearray(target), durable=b"")
        self.next_ino += 1
        self.nodes[node.ino] = node
        self._add(folder, name, node.ino)
        return node

    def link(self, source: str, path: str) -> None:
        node = self.lookup(source)
        if node.is_dir:
            raise fail(errno.EPERM)
        folder, name = self.parent(path)
        if name in folder.entries:
            raise fail(errno.EEXIST)
        self._add(folder, name, node.ino)

    def unlink(self, path: str) -> None:
        folder, name = self.parent(path)
        node = self.lookup(path)
        if node.is_dir:
            raise fail(errno.EISDIR)
        self._del(folder, name)

    def rmdir(self, path: str) -> None:
        folder, name = self.parent(path)
        node = self.lookup(path)
        if not node.is_dir:
            raise fail(errno.ENOTDIR)
        if node.entries:
            raise fail(errno.ENOTEMPTY)
        self._del(folder, name)

    def rename(self, old: str, new: str) -> None:
        src, old_name = self.parent(old)
        node = self.lookup(old)
        dst, new_name = self.parent(new)
        if new.startswith(old.rstrip("/") + "/"):
            raise fail(errno.EINVAL)
        there = dst.entries.get(new_name)
        if there is not None:
            if there == node.ino:
                return
            target = self.nodes[there]
            if target.is_dir and target.entries:
                raise fail(errno.ENOTEMPTY)
            if target.is_dir != node.is_dir:
                raise fail(errno.EISDIR if target.is_dir else errno.ENOTDIR)
        self._del(src, old_name)
        self._add(dst, new_name, node.ino)

    # --- file operations --------------------------------------------------------

    def write(self, node: Node, offset: int, data: bytes) -> int:
        if len(node.data) < offset:
            node.data.extend(bytes(offset - len(node.data)))
        node.data[offset : offset + len(data)] = data
        node.pending.append(("w", offset, bytes(data)))
        node.mtime = time.time()
        return len(data)

    def truncate(self, node: Node, length: int) -> None:
        if length < len(node.data):
            del node.data[length:]
        else:
            node.data.extend(bytes(length - len(node.data)))
        node.pending.append(("t", length, b""))
        node.mtime = time.time()

    def fsync(self, node: Node) -> None:
        if node.is_dir:
            node.durable_entries = dict(node.entries)
            node.pending_entries = []
        else:
            node.durable = bytes(node.data)
            node.pending = []

    # --- the power cut ----------------------------------------------------------

    def cut(self, rng: random.Random) -> None:
        """The power goes out (see the module's docstring)."""
        for node in self.nodes.values():
            if node.is_dir:
                entries = dict(node.durable_entries)
                for op, name, ino in node.pending_entries:
                    if rng.random() < 0.5:
                        continue  # this one never reached the disk
                    if op == "add":
                        entries[name] = ino
                    else:
                        entries.pop(name, None)
                node.entries = entries
                node.durable_entries = dict(entries)
                node.pending_entries = []
            else:
                data = bytearray(node.durable)
                keep = rng.randint(0, len(node.pending))
                for n, (op, offset, whole) in enumerate(node.pending[: keep + 1]):
                    payload = whole
                    if n == keep:  # the one after the kept ones: torn, or not at all
                        if op != "w" or not whole:
                            break
                        payload = whole[: rng.randint(0, len(whole))]
                    if op == "t":
                        del data[offset:]
                        data.extend(bytes(max(0, offset - len(data))))
                    else:
                        data.extend(bytes(max(0, offset - len(data))))
                        data[offset : offset + len(payload)] = payload
                node.data = data
                node.durable = bytes(data)
                node.pending = []
        # what no folder reachable from the root names is gone; a folder that lost
        # its entry loses its subtree
        seen = {1}
        todo = [1]
        while todo:
            for ino in self.nodes[todo.pop()].entries.values():
                if ino in self.nodes and ino not in seen:
                    seen.add(ino)
                    if self.nodes[ino].is_dir:
                        todo.append(ino)
        for node in self.nodes.values():  # entries naming a node that is gone
            if node.is_dir:
                node.entries = {k: v for k, v in node.entries.items() if v in self.nodes}
                node.durable_entries = dict(node.entries)
        self.nodes = {ino: n for ino, n in self.nodes.items() if ino in seen}
