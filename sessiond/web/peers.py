"""Which local process is at the other end of a web connection?

The web listener is TCP: there is no SO_PEERCRED. A connection from this
machine is in the kernel's socket tables (/proc/net/tcp, /proc/net/tcp6) as
the peer's socket, local address = the address we see it from; its line gives
its uid and inode, and the process holding that inode has it among its
/proc/PID/fd links. That process is then judged as on the control socket
(sessiond.ipc.runpeer): a run's process is refused.

It fails closed. A peer whose address is this machine's (loopback, or an
address a socket here can bind) must be in the tables: if its socket is gone
(it reset or closed the connection before it was examined), nothing proves who
it was, and the request is refused ("try again"); so is a socket no process
holds, and one held by several processes unless every one is an operator's.
Only a peer whose address is not this machine's is on another machine (or is
the declared reverse proxy there) and so no run's.

The verdict is bound to the connection: a request that acts is examined anew
(its holders then), a reading request may reuse the connection's last verdict,
and a connection refused once stays refused.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import sys
from collections.abc import Container
from dataclasses import dataclass

from sessiond.ipc.runpeer import examine_process

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
KEEP = 4096  # verdicts kept, one per connection
GONE = (
    "the connection's peer could not be identified (it closed before it could be "
    "examined); try again"
)


@dataclass(frozen=True)
class TcpSocket:
    uid: int
    inode: int


def _address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """'0100007F:1F90' (the kernel's hex, host-order words) -> (127.0.0.1, 8080)."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw), int(port, 16)


def _encode(address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """The inverse of :func:`_address`: how the kernel writes this address and port."""
    raw = address.packed
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{raw.hex().upper()}:{port:04X}"


def _forms(host: str, port: int) -> set[str]:
    """Every way the tables may write ``host:port`` (an IPv4 peer of a dual-stack
    socket is in tcp6 as ::ffff:a.b.c.d)."""
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    forms = {_encode(address, port)}
    if isinstance(address, ipaddress.IPv4Address):
        forms.add(_encode(ipaddress.IPv6Address(f"::ffff:{address}"), port))
    return forms


def find_socket(peer: tuple[str, int], us: tuple[str, int]) -> TcpSocket | None:
    """The socket whose local end is ``peer`` and remote end ``us``, if it is here.

    Compared as the kernel's text, not parsed: the tables also list every
    connection in TIME_WAIT, thousands on a busy console."""
    local, remote = _forms(*peer), _forms(*us)
    for table in TABLES:
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[1] in local and fields[2] in remote:
                return TcpSocket(uid=int(fields[7]), inode=int(fields[9]))
    return None


def holders(sock: TcpSocket, skip: frozenset[int] = frozenset()) -> list[int]:
    """The pids of every process holding the socket (of its uid), newest first;
    none in ``skip`` (the daemon itself, whose descriptors are every session's
    open log: thousands of links to read for nothing). Every one: a socket can be
    shared (inherited, or passed on), and each holder may write on it."""
    with os.scandir("/proc") as procs:
        entries = [e for e in procs if e.name.isdigit()]
    link = f"socket:[{sock.inode}]"
    return [
        int(entry.name)
        for entry in sorted(entries, key=lambda e: -int(e.name))
        if int(entry.name) not in skip and _holds(entry, sock.uid, link)
    ]


def holder(sock: TcpSocket, skip: frozenset[int] = frozenset()) -> int | None:
    """The newest process holding the socket, or None."""
    found = holders(sock, skip)
    return found[0] if found else None


def is_local(host: str) -> bool:
    """Is ``host`` one of this machine's addresses (so a peer from it must be in
    the socket tables)? Loopback always; otherwise: can a socket here bind it?
    In doubt (an error other than "not an address of this machine"), yes."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
        host = str(address)
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET if isinstance(address, ipaddress.IPv4Address) else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
    except OSError as exc:
        return exc.errno != errno.EADDRNOTAVAIL
    return True


def _holds(proc: os.DirEntry[str], uid: int, link: str) -> bool:
    try:
        if proc.stat().st_uid != uid:
            return False
        with os.scandir(f"/proc/{proc.name}/fd") as fds:
            return any(_link(fd.path) == link for fd in fds)
    except OSError:  # gone meanwhile, or not ours to read
        return False


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # that descriptor closed meanwhile: look at the others
        return ""


class WebPeers:
    """Refuses the processes of runs on the web listener, and the peers it cannot
    identify; verdicts kept per connection."""

    def __init__(
        self, run_uids: Container[int] = frozenset(), skip: frozenset[int] | None = None
    ) -> None:
        self.run_uids = run_uids
        self.skip = frozenset({os.getpid()}) if skip is None else skip
        # (peer, us) -> (the peer socket's inode, the verdict)
        self._verdicts: dict[tuple[tuple[str, int], tuple[str, int]], tuple[int, str | None]] = {}

    def refusal(
        self, peer: tuple[str, int], us: tuple[str, int], *, fresh: bool = True
    ) -> str | None:
        """Why the peer at ``peer`` (connected to ``us``) may not use the console.
        ``fresh``: examine its holders now (a request that acts); else the
        connection's last verdict may do."""
        sock = find_socket(peer, us)
        if sock is None:
            # not in this machine's tables: gone (refused), or on another machine
            return GONE if is_local(peer[0]) else None
        if sock.inode == 0:  # closed on its side, left to the kernel (TIME_WAIT…)
            return GONE
        key = (peer, us)
        kept = self._verdicts.get(key)
        if kept is not None and kept[0] == sock.inode and (kept[1] is not None or not fresh):
            return kept[1]  # a refusal sticks to its connection
        why = self._examine(sock)
        if len(self._verdicts) >= KEEP:
            self._verdicts.clear()
        self._verdicts[key] = (sock.inode, why)
        return why

    def _examine(self, sock: TcpSocket) -> str | None:
        pids = holders(sock, self.skip)
        if not pids:
            return "its process cannot be examined (no process holds its socket)"
        for pid in pids:
            why = examine_process(pid, sock.uid, self.run_uids)
            if why is not None:
                return why
        return None
