"""What the cluster's parts need of the daemon they run in (service.py's Daemon).

Protocols only, in a module of their own: the lease keeper, placement, the
mailbox and the forwarding each name what they use of their host here, and
none of them imports another for it.
"""

from __future__ import annotations

from typing import Protocol

from sessiond.syscalls.kernel import Kernel
from sessiond.table.sessions import Session, Table
from sessiond.wake.triggers import Triggers


class Host(Protocol):
    """What carrying requests needs: the table and the kernel."""

    table: Table
    kernel: Kernel


class Node(Protocol):
    """What taking a session over needs: the table, its triggers, the kernel, and
    continuing a session as after a restart."""

    table: Table
    triggers: Triggers
    kernel: Kernel

    def resume(self, s: Session, *, cut_off: bool) -> None: ...
