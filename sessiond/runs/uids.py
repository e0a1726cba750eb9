"""A uid of its own for each session's runs, where the daemon runs as root.

As systemd's ``DynamicUser=`` does, a session gets a uid from ``[run]
dynamic_uids`` (sessiond.sandboxconfig) the first time it runs, kept in
``STATE_DIR/uids.json`` so it is the same at every run and after a restart. A
uid is never 0, never one the machine's accounts have (``getpwuid``), never an
``[access]`` uid and never another session's.

The run must be able to write its workspace. systemd chowns a
``StateDirectory`` to the dynamic uid; a workspace is the operator's own tree
(often a git repository, which git then refuses to work in as its owner), so
the uid gets a POSIX ACL instead: read, write and search on every entry, and
the same as the default ACL of every folder so that files made later (by the
run or by the operator) inherit it. Ownership and mode bits stay as they were.
Walking the tree costs a pass over it, so it is done when the workspace's top
folder does not carry the uid's entry yet.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pwd
import stat
import struct
from pathlib import Path

import orjson

from sessiond.log.store.durable import write_durable

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


class UidError(OSError):
    """No uid can be given, or the workspace cannot be opened to it: says why."""


class DynamicUids:
    """The session -> uid table of one state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "uids.json"
        self._table: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._table is None:
            try:
                loaded = orjson.loads(self.path.read_bytes())
            except FileNotFoundError:
                loaded = {}
            except (OSError, orjson.JSONDecodeError) as exc:
                raise UidError(errno.EIO, f"cannot read {self.path}: {exc}") from None
            self._table = {str(k): int(v) for k, v in dict(loaded).items()}
        return self._table

    def peek(self, session: str) -> int | None:
        """The session's uid if it has one (for ``show``); None if not, or unreadable."""
        try:
            return self._load().get(session)
        except UidError:
            return None

    def uid_of(self, session: str, span: range, refused: set[int]) -> int:
        """The session's uid (given now if it has none): the first free one from a
        place its name picks, so most sessions keep the same uid on every node."""
        table = self._load()
        known = table.get(session)
        if known is not None and known in span:
            return known
        taken = set(table.values()) | refused | {0}
        start = int.from_bytes(hashlib.sha256(session.encode()).digest()[:8], "big")
        for step in range(len(span)):
            uid = span[(start + step) % len(span)]
            if uid in taken or _account(uid):
                continue
            table[session] = uid
            write_durable(self.path, orjson.dumps(table, option=orjson.OPT_SORT_KEYS))
            return uid
        raise UidError(
            errno.ENOSPC,
            f"every uid of [run] dynamic_uids ({span.start}-{span.stop - 1}) is taken: "
            "widen the range in the daemon's configuration",
        )


def _account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _acl(mode: int, uid: int, perm: int, blob: bytes | None = None) -> bytes:
    """An access ACL: the file's own (``blob``, else the mode's bits) with ``uid``
    given ``perm`` besides, and a mask that lets every named entry through."""
    entries: dict[tuple[int, int], int] = {}
    if blob is not None and len(blob) > _HEADER.size:
        for at in range(_HEADER.size, len(blob) - _ENTRY.size + 1, _ENTRY.size):
            tag, bits, ident = _ENTRY.unpack_from(blob, at)
            entries[(tag, ident)] = bits
    else:
        entries[(USER_OBJ, _NO_ID)] = (mode >> 6) & 7
        entries[(GROUP_OBJ, _NO_ID)] = (mode >> 3) & 7
        entries[(OTHER, _NO_ID)] = mode & 7
    entries[(USER, uid)] = entries.get((USER, uid), 0) | perm
    old = entries.get((MASK, _NO_ID))
    if old is not None:
        # widened by what the uid needs and no more: a chmod that narrowed the mask
        # (chmod 700 of a home) keeps the other named entries it turned off off
        mask = old | perm
    else:
        mask = entries.get((GROUP_OBJ, _NO_ID), 0)
        for (tag, _), bits in entries.items():
            if tag in (USER, GROUP):
                mask |= bits
    entries[(MASK, _NO_ID)] = mask
    ordered = sorted(entries.items(), key=lambda e: (e[0][0], e[0][1]))
    return _HEADER.pack(2) + b"".join(_ENTRY.pack(t, b, i) for (t, i), b in ordered)


def _own_acl(path: str, attr: str) -> bytes | None:
    try:
        return os.getxattr(path, attr, follow_symlinks=False)
    except OSError:
        return None


def _has(path: str, uid: int, attr: str) -> bool:
    """``uid`` has an entry in the ACL, in force: a chmod after it was given (chmod 700
    of a home) narrows the mask and turns the entry off, so it is given again."""
    try:
        blob = os.getxattr(path, attr, follow_symlinks=False)
    except OSError:
        return False
    entries = [
        _ENTRY.unpack_from(blob, at)
        for at in range(_HEADER.size, len(blob) - _ENTRY.size + 1, _ENTRY.size)
    ]
    mask = next((bits for tag, bits, _ in entries if tag == MASK), 7)
    return any(tag == USER and ident == uid and bits & mask == bits for tag, bits, ident in entries)


def _open_one(path: str, uid: int) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return  # a symlink has no ACL of its own; its target is opened where it lies
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        given = _acl(mode, uid, 7, _own_acl(path, ACCESS))
        os.setxattr(path, ACCESS, given, follow_symlinks=False)
        made = _acl(0o770, uid, 7, _own_acl(path, DEFAULT))
        os.setxattr(path, DEFAULT, made, follow_symlinks=False)
    elif stat.S_ISREG(st.st_mode):
        perm = 6 | (1 if mode & 0o100 else 0)
        given = _acl(mode, uid, perm, _own_acl(path, ACCESS))
        os.setxattr(path, ACCESS, given, follow_symlinks=False)


def _searchable(folder: Path, uid: int) -> None:
    """The folders above a workspace that others may not search get a search-only
    entry for ``uid`` (nothing in them becomes readable): without it the run could
    not reach its own workspace (a project under ``/root``, say)."""
    for parent in folder.parents:
        path = str(parent)
        st = os.stat(path)
        if st.st_mode & stat.S_IXOTH or _has(path, uid, ACCESS):
            continue
        given = _acl(stat.S_IMODE(st.st_mode), uid, 1, _own_acl(path, ACCESS))
        os.setxattr(path, ACCESS, given)


def reach(path: Path, uid: int) -> None:
    """The folders above ``path`` that others may not search get a search-only entry
    for ``uid``, as a workspace's do: the Python a run starts (a venv, an editable
    checkout of sessiond) may lie in a home folder closed to others. UidError
    naming the folder when that fails (a file system without ACLs)."""
    try:
        _searchable(path, uid)
    except OSError as exc:
        raise UidError(
            exc.errno or errno.EIO,
            f"the run's uid {uid} cannot reach {path} (the Python the daemon runs on, "
            f"which a run's python3 and sessionctl use): {exc}; install sessiond where "
            "others may read it, or set [run] user in the daemon's configuration",
        ) from None


def open_to(folder: Path, uid: int, *, never: set[str], only_inside: set[str]) -> None:
    """Let ``uid`` read and write everything under ``folder`` (see the module's
    docstring), except the paths in ``never`` (the daemon's own: not opened, not
    walked into) and the folders in ``only_inside`` (the socket's folder, which
    must stay writable by its owner alone: what is in it is opened, not itself).
    On a file system without ACLs the folder must already be the uid's to write
    by its mode bits (``writable_by_mode``); else UidError naming the folder, its
    file system and the ways on."""
    top = str(folder)
    if _has(top, uid, ACCESS) and _has(top, uid, DEFAULT):
        return
    try:
        _searchable(folder, uid)
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in never]
            for name in dirs + files:
                path = os.path.join(root, name)
                if path not in never and path not in only_inside:
                    _open_one(path, uid)
        if top not in never and top not in only_inside:
            _open_one(top, uid)  # last: it marks the walk as done
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP):
            raise UidError(
                exc.errno or errno.EIO, f"cannot open {top} to uid {uid}: {exc}"
            ) from None
        if writable_by_mode(top, uid):
            return  # the operator opened it already (mode bits): nothing to add
        raise UidError(
            exc.errno,
            f"{top} is on a file system without POSIX ACLs ({fs_type(top)}), so the "
            f"run's uid {uid} cannot be let write it: move the workspace to one that has "
            "them (ext4, xfs, tmpfs), make it the uid's or writable by all (chmod 1777), "
            "name an account that owns it in the daemon's [run] user, or set [run] "
            'sandbox = "off"',
        ) from None


def writable_by_mode(path: str, uid: int) -> bool:
    """Whether ``uid`` may add files to the folder ``path`` by its mode bits alone:
    it owns it, or the folder is writable and searchable by all. On a file system
    without ACLs nothing narrower can be given, and nothing wider is."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return False
    if st.st_uid == uid:
        return st.st_mode & 0o300 == 0o300
    return st.st_mode & 0o003 == 0o003


def fs_type(path: str) -> str:
    """The type of the file system ``path`` is on (from /proc/self/mounts), for errors."""
    best, kind = "", "unknown file system"
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                where = fields[1].replace("\\040", " ")
                inside = path == where or path.startswith(where.rstrip("/") + "/")
                if inside and len(where) >= len(best):
                    best, kind = where, f"{fields[2]} at {where}"
    except OSError:
        pass
    return kind


def own(folder: Path, uid: int, *, deep: bool) -> None:
    """A private folder of the daemon's (a run's home) made the uid's: all of it
    when ``deep`` (the daemon writes in it too), else once, when it is not yet."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not deep and os.lstat(folder).st_uid == uid:
        return
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.lstat(path).st_uid != uid:
                os.lchown(path, uid, uid)
    os.lchown(folder, uid, uid)
