"""The gateway's door: how many connections it holds, and how many one uid may.

The gateway's TCP port is on loopback, where every local user (and every run with
the host's network) can reach it before any token is asked. Each connection held
is a file descriptor of the daemon's, the same ones its logs, the control socket
and the spawner need: idle connections by the thousand once ran the daemon out of
descriptors, and then even the operator's ``sessionctl`` was refused. So the door
admits at most ``limit`` connections at once (a part of the daemon's descriptors
and at most its ``max_connections``), and at most an eighth of them (at least 16)
from one uid other than the daemon's (a run has a uid of its own under a root
daemon): one run or one local user holding its share leaves the rest to others. A
connection past either is answered 503, saying so, and closed.

The peer's uid comes from the kernel: ``SO_PEERCRED`` on the Unix socket, the
socket tables (``/proc/net/tcp``) for TCP; a TCP peer not found there is counted
as one unknown uid, which has a share as any other.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import resource
import socket
import sys
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from sessiond.ipc.peers import Peer

log = structlog.get_logger(__name__)

UNKNOWN = -1  # a TCP peer the socket tables do not show
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def limit_of(max_connections: int) -> int:
    """The connections the gateway holds at most: a quarter of the daemon's file
    descriptors (its logs and sockets keep the rest), and no more than the
    daemon's ``max_connections``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    fds = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max(16, min(max_connections, fds // 4))


def _kernel_form(host: str, port: int) -> set[str]:
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    forms = {address}
    if isinstance(address, ipaddress.IPv4Address):
        forms.add(ipaddress.IPv6Address(f"::ffff:{address}"))
    out = set()
    for a in forms:
        raw = a.packed
        if sys.byteorder == "little":  # the tables write host-order words
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        out.add(f"{raw.hex().upper()}:{port:04X}")
    return out


def tcp_uid(peer: tuple[str, int], us: tuple[str, int]) -> int:
    """The uid owning the local socket at ``peer`` connected to ``us``. Found by a
    plain text search (in C) of the tables, not by splitting their lines: they may
    hold many thousand connections (TIME_WAIT ones too), and each new connection
    is looked up on the daemon's loop."""
    local, remote = _kernel_form(*peer[:2]), _kernel_form(*us[:2])
    for table in TABLES:
        try:
            with open(table) as f:
                text = f.read()
        except OSError:
            continue
        for pair in (f" {a} {b} " for a in local for b in remote):
            at = text.find(pair)
            if at >= 0:
                fields = text[at : text.find("\n", at)].split()
                return int(fields[6]) if len(fields) > 6 else UNKNOWN
    return UNKNOWN


def uid_of(transport: asyncio.BaseTransport) -> int:
    sock = transport.get_extra_info("socket")
    try:
        if sock is None:
            return UNKNOWN
        if sock.family == socket.AF_UNIX:
            return Peer.of(sock).uid
        return tcp_uid(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
    except (OSError, ValueError, TypeError):
        return UNKNOWN


def _busy(message: str) -> bytes:
    # both SDKs read error.message; the status says retry later
    body = orjson.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": message}}
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class Door:
    """Admits the gateway's connections: ``protocol`` is the listeners' factory;
    ``handler()`` makes aiohttp's protocol for an admitted connection, and
    ``live()`` lists those still open."""

    def __init__(
        self, handler: Callable[[], Any], live: Callable[[], list[Any]], limit: int
    ) -> None:
        self.handler, self.live, self.limit = handler, live, limit
        self.share = max(16, limit // 8)
        self._uids: dict[Any, int] = {}  # admitted handler -> its peer's uid
        self.refused = 0

    def protocol(self) -> asyncio.Protocol:
        return _Doorway(self)

    def admit(self, transport: asyncio.BaseTransport) -> str | None:
        """Why this connection is refused, or None (it is then handed on)."""
        live = self.live()
        if len(self._uids) > len(live):  # forget the closed ones
            still = set(live)
            self._uids = {h: u for h, u in self._uids.items() if h in still}
        if len(live) >= self.limit:
            return (
                f"the model gateway holds too many connections ({self.limit}); close idle "
                "ones and retry"
            )
        uid = uid_of(transport)
        mine = sum(1 for u in self._uids.values() if u == uid)
        if uid != os.getuid() and mine >= self.share:
            return (
                f"too many connections to the model gateway from this uid (at most "
                f"{self.share} at once, an eighth of {self.limit}); close idle ones and retry"
            )
        handler = self.handler()
        self._uids[handler] = uid
        transport.set_protocol(handler)
        handler.connection_made(transport)
        return None


class _Doorway(asyncio.Protocol):
    """A connection's protocol until it is admitted (then aiohttp's) or refused."""

    def __init__(self, door: Door) -> None:
        self.door = door

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        why = self.door.admit(transport)
        if why is not None:
            self.door.refused += 1
            if self.door.refused & (self.door.refused - 1) == 0:  # 1, 2, 4…: no flood
                log.warning("gateway.busy", why=why, refused=self.door.refused)
            # (uvloop's transports are not asyncio's classes: written to as they are)
            writer: Any = transport
            writer.write(_busy(why))
            transport.close()
