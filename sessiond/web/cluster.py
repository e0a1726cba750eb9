"""The console on a cluster node shows and acts on the whole cluster (docs/design.md
sections 10 and 11), the way ``sessionctl`` on that node's socket does.

Its table and inbox are every node's own lists merged (``web.rows`` and
``web.approvals``, asked of each live node like ``ps``); a page of a session
another node runs is made of the same carried syscalls as ``sessionctl show``,
``gate`` and ``log`` there, its messages folded from the events table; and an
action on it (approve, deny, resolve, the lifecycle) is the same syscall carried
to its owner, with the web user as who did it, so it is checked and recorded
there exactly as one made on that node's console. The peer checks (a process of
a run is refused) happen here, where the browser connected, before anything is
carried. On a plain-files daemon there is no ``forward`` and all of this is the
local table's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from sessiond.log.replay import replay_all
from sessiond.log.state import State
from sessiond.log.store.base import Record
from sessiond.replies import ConsoleApproval, ConsoleRow, GateReport, JsonObject, SessionDetail, Who
from sessiond.syscalls.console import approvals
from sessiond.syscalls.kernel import Kernel

REFRESH = 2.0  # seconds: how often a live page of the whole cluster is rendered again


class Carrier(Protocol):
    """What the console needs of a node's forwarding (sessiond.cluster.forward)."""

    async def route(self, method: str, params: JsonObject, who: Who) -> tuple[bool, Any]: ...

    async def ps(self, who: Who, method: str = "ps", params: JsonObject | None = None) -> Any: ...

    async def approvals(self, who: Who) -> list[ConsoleApproval]: ...


class Hinted(Protocol):
    def watch(self, session: str, wake: Callable[[], None]) -> Callable[[], None]: ...


class ClusterView:
    """Where a session is, and the syscalls for it wherever it runs."""

    def __init__(
        self, kernel: Kernel, forward: Carrier | None = None, hints: Hinted | None = None
    ) -> None:
        self.kernel = kernel
        self.forward = forward  # a cluster node's carried requests (sessiond.cluster.forward)
        self.hints = hints  # commits of sessions other nodes run

    @property
    def clustered(self) -> bool:
        return self.forward is not None

    def remote(self, name: str) -> bool:
        """Another node's (or nobody's) session, as far as this node can tell."""
        return self.forward is not None and name not in self.kernel.table.sessions

    async def syscall(
        self,
        method: str,
        params: JsonObject,
        who: Who,
        here: Callable[[], Awaitable[Any]],
    ) -> Any:
        """``method`` for the session ``params["name"]``: carried to the node that runs
        it, or ``here`` (this node's, or a session the cluster does not have: the
        same error as on one machine)."""
        target = params.get("name", params.get("to"))  # `send` names its session `to`
        if self.forward is not None and self.remote(str(target)):
            routed, result = await self.forward.route(method, params, who)
            if routed:
                return result
        return await here()

    async def rows(self, who: Who) -> list[ConsoleRow]:
        assert self.forward is not None
        rows: list[ConsoleRow] = await self.forward.ps(who, "web.rows")
        return rows

    async def approvals(self, who: Who) -> list[ConsoleApproval]:
        assert self.forward is not None
        return await self.forward.approvals(who)

    async def show(self, name: str, who: Who) -> SessionDetail:
        """``show``, with the node that runs it on a cluster (the page says where)."""
        shown: SessionDetail = await self.syscall(
            "show", {"name": name}, who, lambda: self.kernel.show(name)
        )
        if self.forward is not None:
            here = name in self.kernel.table.sessions
            store = self.kernel.store
            node = self.kernel.config.cluster.node if here else None
            shown["node"] = node or await asyncio.to_thread(store.owner_of, name)
        return shown

    async def gate(self, name: str, who: Who) -> GateReport:
        report: GateReport = await self.syscall(
            "gate", {"name": name}, who, lambda: self.kernel.gate(name)
        )
        return report

    async def log(
        self,
        name: str,
        who: Who,
        since: int | str = 1,
        types: list[str] | None = None,
        limit: int = 0,
        *,
        grep: str | None = None,
    ) -> list[Record]:
        params: JsonObject = {"name": name, "since": since, "types": list(types or []),
                              "limit": limit, "grep": grep}  # fmt: skip
        records = await self.syscall(
            "log", params, who, lambda: self.kernel.log_(name, since, types, limit, grep=grep)
        )
        return list(records)

    async def pending(self, name: str, who: Who) -> list[ConsoleApproval]:
        """The session's pending approvals, as the inbox lists them."""
        items = await self.syscall(
            "web.approvals", {"name": name}, who,
            lambda: approvals([self.kernel.table.get(name)]),
        )  # fmt: skip
        return list(items)

    async def folded(self, name: str, upto: int | None) -> tuple[list[Record], State]:
        """A session another node runs: its events from the table (up to ``upto``)
        and its state folded from all of them (its messages view's)."""
        store = self.kernel.store

        def read() -> tuple[list[Record], State]:
            records = list(store.read(name))
            state = replay_all(name, records)
            return [r for r in records if upto is None or r["seq"] <= upto], state

        return await asyncio.to_thread(read)
