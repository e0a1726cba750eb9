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


def _plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def find_socket(peer: tuple[str, int], us: tuple[str, int]) -> TcpSocket | None:
    """The socket whose local end is ``peer`` and remote end ``us``, if it is here."""
    want_local = (_plain(ipaddress.ip_address(peer[0])), peer[1])
    want_remote = (_plain(ipaddress.ip_address(us[0])), us[1])
    for table in TABLES:
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local, remote = _address(fields[1]), _address(fields[2])
            if (_plain(local[0]), local[1]) == want_local and (
                _plain(remote[0]),
                remote[1],
            ) == want_remote:
                return TcpSocket(uid=int(fields[7]), inode=int(fields[9]))
    return None


def holder(sock: TcpSocket) -> int | None:
    """The pid of a process holding the socket (of its uid), or None."""
    link = f"socket:[{sock.inode}]"
    with os.scandir("/proc") as procs:
        for entry in procs:
            if entry.name.isdigit() and _holds(entry, sock.uid, link):
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

    def __init__(self, run_uids: frozenset[int] = frozenset()) -> None:
        self.run_uids = run_uids
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
        pid = holder(sock)
        if pid is None:
            why: str | None = "its process cannot be examined (no process holds its socket)"
        else:
            why = examine_process(pid, sock.uid, self.run_uids)
        if len(self._verdicts) >= KEEP:
            self._verdicts.clear()
        self._verdicts[sock.inode] = why
        return why
