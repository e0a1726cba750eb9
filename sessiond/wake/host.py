"""What the triggers need of the kernel, named as a protocol.

The triggers decide *when* a session continues; recording the wake and starting
the run belong to the floors above (sessiond.syscalls.kernel.Kernel is the host
the daemon passes in). A protocol, so that wake/ does not import upwards: the
kernel satisfies it by having these members under these names.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from sessiond.log.store.base import Record, Store
from sessiond.table.sessions import Session, Table


class WakeHost(Protocol):
    @property
    def table(self) -> Table:
        """Every session, to arm at start-up and to tell a removed one."""
        ...

    @property
    def store(self) -> Store:
        """The logs (the last wake of a kind) and the session folders (git cursors)."""
        ...

    async def wake(
        self,
        s: Session,
        trigger: str,
        details: dict[str, Any],  # each trigger kind's own (recorded in session.woken)
        paths: frozenset[str] = frozenset(),
    ) -> Record:
        """Record a wake; continue the session now if it is free."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, keeping a reference until it is done."""
        ...


def last_wake(
    host: WakeHost,
    s: Session,
    trigger: str,
    # a waiting wake's details: each trigger kind's own
    which: Callable[[dict[str, Any]], bool] | None = None,
) -> Record | None:
    """The newest wake of this kind (and, given ``which``, with these details)."""
    last = None
    for record in host.store.read(s.name):
        data = record["data"]
        if record["type"] != "wake.requested" or data["trigger"] != trigger:
            continue
        if which is None or which(data["details"]):
            last = record
    return last
