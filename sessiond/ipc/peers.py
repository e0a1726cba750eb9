"""Who may use the daemon: the peer-credential check on every connection.

The socket's file mode is the first fence; this is the real one. The kernel
tells us the connecting process's pid, uid and gid (SO_PEERCRED), and a peer is
let in if its uid, or one of its groups, is allowed. It is apart from the server
so the rule reads on its own and a reload can swap the allowed lists.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import struct
from collections.abc import Container
from dataclasses import dataclass

from sessiond.config import AccessConfig

_CREDS = struct.Struct("3i")


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a connection, as the kernel reports it."""

    pid: int
    uid: int
    gid: int

    @classmethod
    def of(cls, sock: socket.socket) -> Peer:
        pid, uid, gid = _CREDS.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
        )
        return cls(pid, uid, gid)


class Peers:
    """The allowed uids and gids, and the check against them."""

    def __init__(self, access: AccessConfig, runs: Container[int] = frozenset()) -> None:
        self.uids: set[int] = set()
        self.gids: set[int] = set()
        # the uids runs have ([run] user's, the dynamic range: sessiond.sandboxconfig):
        # their processes are programs, never operators
        self.run_uids: Container[int] = frozenset()
        self.allow(access, runs)

    def allow(self, access: AccessConfig, runs: Container[int] = frozenset()) -> None:
        """Who may connect: the daemon's user, root, and the configured users and groups.
        ``run_uids``: the uids runs are given (default: the [run] user's and
        :data:`DYNAMIC_UIDS`). (A reload applies a new list to the next connections.)"""
        self.uids = {os.getuid(), 0} | access.uids()
        self.gids = access.gids()
        self.run_uids = runs

    def allowed(self, peer: Peer, *, programs: bool = False) -> bool:
        """``programs``: the program endpoint, where the [run] user connects too."""
        if peer.uid in self.uids or (programs and peer.uid in self.run_uids):
            return True
        if self.gids:
            groups = {peer.gid}
            with contextlib.suppress(KeyError):
                groups.update(os.getgrouplist(pwd.getpwuid(peer.uid).pw_name, peer.gid))
            if groups & self.gids:
                return True
        return False
