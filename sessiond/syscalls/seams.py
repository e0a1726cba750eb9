"""What cluster mode changes in the syscalls, as protocols the families receive
at construction (docs/architecture.md, "The cluster floor").

On one machine each seam is ``None`` and the syscalls are the local ones. On a
cluster node the daemon builds them from ``sessiond.cluster`` (the floor above
this one) and hands them to the :class:`~sessiond.syscalls.kernel.Kernel`, the
dispatch and the console when it constructs them; nothing is swapped later, so
what ``ps`` does is read here and in the family that calls it, not in start-up
code. An implementation may do nothing until its node has started (a placement
before the node takes part in the cluster lists only the local sessions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sessiond.replies import (
    Draining,
    JsonObject,
    NodeMove,
    NodeRow,
    PsRow,
    Sent,
    WaitingSession,
    Who,
)


class Placement(Protocol):
    """Where a session may run (``ps``, ``show``, ``create``)."""

    async def waiting(self) -> list[PsRow]:
        """``ps`` rows of the sessions no live node runs, each saying what it waits for."""
        ...

    async def show_waiting(self, name: str) -> WaitingSession | None:
        """``show`` of a session no live node runs; None: no such session, or a
        live node runs it (the caller's NoSuchSession stands)."""
        ...

    async def place(self, name: str) -> str | None:
        """A session just made here that may not run here goes now: the node it
        went to, or None (it stays, or waits for a node it fits)."""
        ...


class Nodes(Protocol):
    """The syscalls of the cluster's nodes: ``nodes``, ``migrate --node``, ``drain``."""

    async def nodes(self) -> list[NodeRow]: ...

    async def migrate_node(
        self,
        name: str,
        to: str,
        profile: str | None = None,
        socket: str | None = None,
        *,
        force: bool = False,
    ) -> NodeMove: ...

    async def drain(self, name: str) -> Draining: ...


class Mail(Protocol):
    """``send`` (and a program's ``run.send``) to a session another node runs."""

    async def post(self, to: str, text: str, sender: str) -> Sent | None:
        """Leave the message for the node that runs ``to``: the answer to give, or
        None when no node has such a session (the local send refuses it)."""
        ...

    async def exists(self, name: str) -> bool:
        """Is ``name`` a session of the cluster (on any node)?"""
        ...


class Router(Protocol):
    """Requests for sessions other nodes run, carried to them (the dispatch's and
    the console's seam)."""

    async def route(self, method: str, params: JsonObject, who: Who) -> tuple[bool, Any]:
        """(True, the owner's answer), or (False, None): answer it here."""
        ...


class Follows(Protocol):
    """Hints that another node committed events of a session followed here."""

    def watch(self, session: str, wake: Callable[[], None]) -> Callable[[], None]: ...


@dataclass(frozen=True)
class Seams:
    """The kernel's seams: all None on one machine."""

    placement: Placement | None = None
    nodes: Nodes | None = None
    mail: Mail | None = None


ONE_MACHINE = Seams()
