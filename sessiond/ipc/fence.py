"""The socket's first fence: its folder, its file mode and its POSIX ACLs.

docs/design.md section 6: by default the socket is 0600 in a 0700 folder owned by the
daemon's user; a folder owned by anyone else, or writable by others, is refused
(whoever can write the folder can replace the socket with their own and read
what clients send). When ``[access]`` names other users or groups they get in
through POSIX ACLs on the folder (search) and the socket (read and write) —
the mode bits stay owner-only, so nothing is opened to everyone. The peer
credential check (sessiond.ipc.peers) is the real fence; this one keeps
everybody else from even connecting.

The ACL is written as the kernel's own extended attribute
(``system.posix_acl_access``) rather than through ``setfacl`` or a binding to
libacl: the format is four fixed-size fields a entry, stable since Linux 2.6, and
it spares the daemon a package and a subprocess at start-up.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path

from sessiond.errors import SessiondError

XATTR = "system.posix_acl_access"
_VERSION = 2
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
# entry tags (linux/posix_acl_xattr.h); the kernel wants them in this order
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
READ, WRITE, EXECUTE = 4, 2, 1


class FenceError(SessiondError):
    """The socket's folder or file cannot be made private; the message says why."""


def check_folder(folder: Path) -> None:
    """Create the socket's folder owner-only, or accept an existing one only if the
    daemon's user owns it and nobody else may write it; tighten it to 0700."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise FenceError(
            f"the socket folder {folder} is not a folder (a symlink or a file): remove it, "
            "or choose another --socket"
        )
    me = os.geteuid()
    if st.st_uid != me:
        raise FenceError(
            f"the socket folder {folder} is owned by uid {st.st_uid}, not by the daemon's "
            f"uid {me}: another user could replace the socket; remove the folder, or "
            "choose another --socket in a folder of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise FenceError(
            f"the socket folder {folder} is writable by others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): anyone could replace the socket; put the "
            "socket in a folder of its own (the default is $XDG_RUNTIME_DIR/sessiond), "
            f"or make it private with 'chmod 700 {folder}'"
        )
    os.chmod(folder, 0o700)


def encode_acl(mode: int, users: dict[int, int], groups: dict[int, int]) -> bytes:
    """The ``system.posix_acl_access`` value for a file with ``mode``'s owner, group
    and other bits plus named users and groups (id -> permission bits)."""
    entries = [(USER_OBJ, (mode >> 6) & 7, _NO_ID)]
    entries += [(USER, perm, uid) for uid, perm in sorted(users.items())]
    entries.append((GROUP_OBJ, (mode >> 3) & 7, _NO_ID))
    entries += [(GROUP, perm, gid) for gid, perm in sorted(groups.items())]
    if users or groups:
        # The mask bounds every named entry and the owning group; it is what
        # `ls -l` then shows as the group bits.
        mask = (mode >> 3) & 7
        for perm in (*users.values(), *groups.values()):
            mask |= perm
        entries.append((MASK, mask, _NO_ID))
    entries.append((OTHER, mode & 7, _NO_ID))
    return _HEADER.pack(_VERSION) + b"".join(_ENTRY.pack(*e) for e in entries)


def decode_acl(blob: bytes) -> list[tuple[int, int, int]]:
    """The (tag, perm, id) entries of an ACL attribute (for tests and `show`)."""
    (version,) = _HEADER.unpack_from(blob)
    if version != _VERSION:
        raise ValueError(f"unknown ACL version {version}")
    return [
        _ENTRY.unpack_from(blob, offset) for offset in range(_HEADER.size, len(blob), _ENTRY.size)
    ]


def grant(path: Path, perm: int, uids: set[int], gids: set[int]) -> None:
    """Let ``uids`` and ``gids`` have ``perm`` on ``path`` through its ACL, its
    mode bits staying as they are (owner-only)."""
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    blob = encode_acl(mode, dict.fromkeys(uids, perm), dict.fromkeys(gids, perm))
    try:
        os.setxattr(path, XATTR, blob, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            raise FenceError(
                f"{path} is on a file system without POSIX ACLs, so [access] cannot let "
                "other users in without opening the socket to everyone; put the socket "
                "on one that has them (ext4, xfs, tmpfs) or use systemd socket "
                "activation with SocketUser=/SocketGroup="
            ) from None
        raise FenceError(f"cannot set the ACL of {path}: {exc.strerror}") from None


def share(folder: Path, socket_path: Path, uids: set[int], gids: set[int]) -> None:
    """Open the socket to the allowed users and groups, and to nobody else: search
    on the folder (to reach the socket), read and write on the socket (to connect)."""
    others = {u for u in uids if u != os.geteuid()}
    grant(folder, EXECUTE, others, gids)
    grant(socket_path, READ | WRITE, others, gids)
