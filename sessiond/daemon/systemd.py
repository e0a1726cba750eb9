"""systemd integration: the notify protocol and socket activation, without libsystemd.

* ``NOTIFY_SOCKET`` (set by systemd for ``Type=notify``): the daemon sends
  ``READY=1`` once it serves, ``STATUS=`` with sessions by state, ``WATCHDOG=1``
  at half of ``WATCHDOG_USEC``, ``RELOADING=1`` around a reload and
  ``STOPPING=1`` on shutdown. Datagrams on an AF_UNIX socket; a name starting
  with ``@`` is in the abstract namespace.
* ``LISTEN_FDS`` / ``LISTEN_PID`` (socket activation, ``sessiond.socket``): the
  listening socket arrives as file descriptor 3.

Without these variables everything here does nothing.
"""

from __future__ import annotations

import os
import socket
import time

import structlog

log = structlog.get_logger(__name__)

LISTEN_FDS_START = 3


class Notifier:
    def __init__(self, env: dict[str, str]) -> None:
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address
        self.sock: socket.socket | None = None
        if address:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval = (
            int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else None
        )

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def send(self, *fields: str) -> None:
        if self.sock is None:
            return
        message = "\n".join(fields).encode()
        try:
            self.sock.sendto(message, self.address)
        except OSError as exc:  # systemd went away: keep running, say so once
            log.warning("notify.failed", error=str(exc))
            self.sock.close()
            self.sock = None

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def reloading(self) -> None:
        self.send(
            "RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
        )

    def reloaded(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def activated_socket(env: dict[str, str]) -> socket.socket | None:
    """The listening socket systemd passed (socket activation), if any."""
    if env.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    if count < 1:
        return None
    sock = socket.socket(fileno=LISTEN_FDS_START)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise OSError("the socket systemd passed is not a Unix stream socket")
    sock.setblocking(False)
    return sock
