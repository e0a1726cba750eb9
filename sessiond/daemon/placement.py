"""Placement on a cluster node (docs/design.md section 10): wiring only.

The rules are the database's (sessiond/log/store/pg/placement.py): which node a
session may run on, checked in the statement that claims or hands it over. Here
the node

- hands a session it may not run (created, forked, imported or reloaded here
  with a spec that pins it elsewhere or needs labels this node lacks) to a node
  it fits, at a stable point, or lets go of it when no such node is up;
- refuses ``migrate --node`` to a node the session does not fit, saying why;
- lists, in ``ps`` and ``show``, the sessions no live node runs and what each
  waits for ("waiting for node n2");
- re-homes, on an operator's word (``migrate S --node N --force``), a session
  whose node is down and whose workspace is on node N now (restored there, or
  the disk moved): N takes it over as after a crash.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from sessiond.errors import NoSuchSession, Refused
from sessiond.replies import PsRow, SessionDetail, WaitingSession

if TYPE_CHECKING:
    from sessiond.daemon.cluster import Node
    from sessiond.log.store.pg.pgstore import PgStore
    from sessiond.table.sessions import Session

log = structlog.get_logger("sessiond.cluster")

HandOver = Callable[["Session", "str | None"], Awaitable["str | None"]]


class Placer:
    def __init__(self, store: PgStore, node: Node, hand_over: HandOver) -> None:
        self.store = store
        self.node = node
        self.hand_over = hand_over  # LeaseKeeper's: at a stable point, or let go

    def install(self) -> None:
        """Wrap the syscalls placement changes (the socket looks them up per call)."""
        kernel = self.node.kernel
        local_ps, local_show = kernel.ps, kernel.show
        local_create, local_create_spec = kernel.create, kernel.create_spec

        async def ps() -> list[PsRow]:
            rows = await local_ps()
            have = {r["name"] for r in rows}
            waiting = await asyncio.to_thread(self.store.waiting)
            rows += [_row(w) for w in waiting if w["name"] not in have]
            return sorted(rows, key=lambda r: str(r["name"]))

        async def show(name: str) -> SessionDetail | WaitingSession:
            try:
                return await local_show(name)
            except NoSuchSession:
                found = await asyncio.to_thread(self.store.placement, name)
                if found is None or found[2]:
                    raise  # no such session, or a live node runs it
                placed, owner, _ = found
                # here, not at the top: a daemon on files never imports the pg package
                from sessiond.log.store.pg.placement import waiting_reason

                row = _row({"name": name, "node": placed.home or owner})
                row["reason"] = waiting_reason(placed, owner)
                waiting: WaitingSession = {**row, "program": None, "triggers": [], "seq": None}
                return waiting

        async def create(spec: str, base: str, source: str = "spec") -> SessionDetail:
            answer = await local_create(spec, base, source)
            moved = await self.place(answer["name"])
            if moved is not None:
                answer["handed_to"] = moved
            return answer

        async def create_spec(spec: Any) -> Session:
            s = await local_create_spec(spec)
            await self.place(s.name)
            return s

        kernel.ps, kernel.show = ps, show
        kernel.create, kernel.create_spec = create, create_spec

    async def place(self, name: str) -> str | None:
        """A session just made here that may not run here goes now: the node it
        went to, or None (it stays, or waits for a node it fits)."""
        if name in await asyncio.to_thread(self.store.misplaced):
            s = self.node.table.sessions.get(name)
            if s is not None:
                return await self.hand_over(s, None)
        if name in self.node.table.sessions:
            return None
        # the take-over's sweep handed it over first: say where it went
        return await asyncio.to_thread(self.store.owner_of, name)

    async def sweep(self) -> None:
        """Each take-over tick: move on what this node holds and may not run."""
        for name in await asyncio.to_thread(self.store.misplaced):
            s = self.node.table.sessions.get(name)
            if s is None or s.run is not None or s.state in ("running", "ready"):
                continue  # not loaded here, or at its next stable point
            await self.hand_over(s, None)

    async def refusal(self, name: str, to: str) -> str | None:
        """Why ``name`` may not go to node ``to`` (None: it may, as far as placement goes)."""
        found, target = await asyncio.gather(
            asyncio.to_thread(self.store.placement, name),
            asyncio.to_thread(self.store.node_row, to),
        )
        if found is None or target is None:
            return None  # refused by the hand-over itself, with its own reason
        return found[0].refusal(to, target[2])

    async def rehome(self, name: str, to: str) -> dict[str, Any]:
        """``migrate S --node N --force``. Only for a session nobody runs: a live
        owner hands it over at a stable point instead (without --force). Its pin
        and labels still hold; only where its workspace is changes. The epoch goes
        up with ``to``'s claim, so a node that comes back writes nothing of it."""
        me = self.store.lease.name
        if name in self.node.table.sessions:
            raise Refused(
                f"session {name!r} runs on node {me!r}, which is up: --force is for a "
                f"session whose node is down; `sessionctl migrate {name} --node {to}` "
                "hands it over at a stable point"
            )
        found, target = await asyncio.gather(
            asyncio.to_thread(self.store.placement, name),
            asyncio.to_thread(self.store.node_row, to),
        )
        if found is None:
            raise NoSuchSession(
                f"no session {name!r}; 'sessionctl ps' lists the sessions there are"
            )
        placed, owner, alive = found
        if alive:
            raise Refused(
                f"session {name!r} runs on node {owner!r}, which is up: --force is for a "
                f"session whose node is down; without it, migrate hands it over at a "
                "stable point"
            )
        if target is None or not target[0] or target[1] != "up":
            raise Refused(
                f"node {to!r} is not a live node that takes sessions (up, not draining); "
                "`sessionctl nodes` lists them"
            )
        why = replace(placed, workspace_node=None).refusal(to, target[2])
        if why is not None:  # its pin or labels: the spec's word, not the workspace's
            raise refused(name, to, why)
        if placed.workspace_node is None:
            raise Refused(
                f"session {name!r} has no workspace tied to a node: a node it fits takes it "
                f"over by itself (`sessionctl show {name}` says what it waits for)"
            )
        if not await asyncio.to_thread(self.store.rehome, name, to):
            raise Refused(
                f"session {name!r} was not re-homed: its node came back or {to!r} went "
                "away meanwhile; `sessionctl ps` and `sessionctl nodes` say where things are"
            )
        log.warning("cluster.rehomed", session=name, node=to, was=placed.workspace_node)
        return {"session": name, "node": to, "rehomed": True, "was": placed.workspace_node}


def _row(w: dict[str, Any]) -> PsRow:
    """A ``ps`` row of a session no live node runs."""
    return placeholder(w["name"], "waiting", w.get("reason"), w.get("node"))


def placeholder(name: str, state: str, reason: str | None, node: str | None) -> PsRow:
    """A ``ps`` row for a session no live node runs or answered for (here, and in
    daemon/forward.py's ``ps`` of the whole cluster)."""
    return {
        "name": name,
        "state": state,
        "reason": reason,
        "agent": "",
        "priority": 0,
        "runs": 0,
        "last_active": None,
        "next_wake": None,
        "pid": None,
        "parent": None,
        "outcome": None,
        "labels": {},
        "node": node,
    }


def refused(name: str, to: str, why: str) -> Refused:
    return Refused(f"session {name!r} cannot go to node {to!r}: {why}")
