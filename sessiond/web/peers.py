"""Which local process is at the other end of a web connection?

The web listener is TCP: there is no SO_PEERCRED. A connection from this
machine is in the kernel's socket tables (/proc/net/tcp, /proc/net/tcp6) as
the peer's socket, local address = the address we see it from; its line gives
its uid and inode, and the process holding that inode has it among its
/proc/PID/fd links. That process is then judged as on the control socket
(sessiond.ipc.runpeer): a run's process is refused. A peer not in the tables
is on another machine (or behind the declared reverse proxy) and is no run's.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Container
from dataclasses import dataclass

from sessiond.ipc.runpeer import examine_process

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
KEEP = 4096  # verdicts kept, by socket inode (one per connection)


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


def holder(sock: TcpSocket, skip: frozenset[int] = frozenset()) -> int | None:
    """The pid of a process holding the socket (of its uid), or None.

    Newest pids first (a client that just connected is likely among them), and
    none in ``skip`` (the daemon itself, whose descriptors are every session's
    open log: thousands of links to read for nothing)."""
    with os.scandir("/proc") as procs:
        entries = [e for e in procs if e.name.isdigit()]
    link = f"socket:[{sock.inode}]"
    for entry in sorted(entries, key=lambda e: -int(e.name)):
        if int(entry.name) not in skip and _holds(entry, sock.uid, link):
            return int(entry.name)
    return None


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
    """Refuses the processes of runs on the web listener; verdicts kept per socket."""

    def __init__(
        self, run_uids: Container[int] = frozenset(), skip: frozenset[int] | None = None
    ) -> None:
        self.run_uids = run_uids
        self.skip = frozenset({os.getpid()}) if skip is None else skip
        self._verdicts: dict[int, str | None] = {}

    def refusal(self, peer: tuple[str, int], us: tuple[str, int]) -> str | None:
        """Why the peer at ``peer`` (connected to ``us``) may not use the console."""
        sock = find_socket(peer, us)
        if sock is None:
            return None  # not a socket of this machine: nobody's run
        if sock.inode in self._verdicts:
            return self._verdicts[sock.inode]
        if sock.inode == 0:
            return "its process cannot be examined (its socket has no inode)"
        pid = holder(sock, self.skip)
        if pid is None:
            why: str | None = "its process cannot be examined (no process holds its socket)"
        else:
            why = examine_process(pid, sock.uid, self.run_uids)
        if len(self._verdicts) >= KEEP:
            self._verdicts.clear()
        self._verdicts[sock.inode] = why
        return why
