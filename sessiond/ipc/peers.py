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
from collections.abc import Container, Iterable
from dataclasses import dataclass

from sessiond.config import AccessConfig

_CREDS = struct.Struct("3i")
# The uids the daemon gives sessions' runs, one per session, when it runs as
# root (the default of the sandbox's `[run] dynamic_uids`): a uid in this range
# is always a run's, never an operator's, whatever [access] says. Defined here
# alone: the configured range is passed to Peers as ``run_uids``.
DYNAMIC_UIDS = range(458752, 524288)


class RunUids(Container[int]):
    """The uids that are runs': the [run] user's and ranges of dynamic ones."""

    def __init__(self, uids: Iterable[int] = (), ranges: Iterable[range] = (DYNAMIC_UIDS,)) -> None:
        self.uids = frozenset(uids)
        self.ranges = tuple(ranges)

    def __contains__(self, uid: object) -> bool:
        return uid in self.uids or any(uid in r for r in self.ranges)

    def union(self, other: Container[int]) -> Container[int]:
        """These uids or ``other``'s."""
        return _Either(self, other)

    def __repr__(self) -> str:
        return f"RunUids({sorted(self.uids)}, {list(self.ranges)})"


@dataclass(frozen=True)
class _Either(Container[int]):
    first: Container[int]
    second: Container[int]

    def __contains__(self, uid: object) -> bool:
        return uid in self.first or uid in self.second


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

    def __init__(
        self,
        access: AccessConfig,
        run_user: tuple[int, int] | None = None,
        run_uids: Container[int] | None = None,
    ) -> None:
        self.uids: set[int] = set()
        self.gids: set[int] = set()
        # runs' uids ([run] user, the dynamic ones): their processes are programs,
        # never operators
        self.run_uids: Container[int] = RunUids()
        self._given = run_uids  # kept across reloads that do not name them
        self.allow(access, run_user, run_uids)

    def allow(
        self,
        access: AccessConfig,
        run_user: tuple[int, int] | None = None,
        run_uids: Container[int] | None = None,
    ) -> None:
        """Who may connect: the daemon's user, root, and the configured users and groups.
        ``run_uids``: the uids runs are given (default: the [run] user's and
        :data:`DYNAMIC_UIDS`). (A reload applies a new list to the next connections.)"""
        self.uids = {os.getuid(), 0} | access.uids()
        self.gids = access.gids()
        self._given = run_uids if run_uids is not None else self._given
        given = self._given if self._given is not None else RunUids()
        self.run_uids = RunUids({run_user[0]}, ()).union(given) if run_user is not None else given

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
