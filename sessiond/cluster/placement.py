"""Placement on a cluster node (docs/design.md section 10).

What a spec asks for (:func:`placement_of`, read from the parsed spec) is
recorded in the session's row by the store, whose claims check it
(sessiond/log/store/pg/placement.py), as do coordination's hand-overs
(sessiond.cluster.coordination). Here the node

- hands a session it may not run (created, forked, imported or reloaded here
  with a spec that pins it elsewhere or needs labels this node lacks) to a node
  it fits, at a stable point, or lets go of it when no such node is up;
- refuses ``migrate --node`` to a node the session does not fit, saying why;
- lists, in ``ps`` and ``show``, the sessions no live node runs and what each
  waits for ("waiting for node n2"): the kernel's placement seam
  (sessiond.syscalls.seams), which the inspection and control families call;
- re-homes, on an operator's word (``migrate S --node N --force``), a session
  whose node is down and whose workspace is on node N now (restored there, or
  the disk moved): N takes it over as after a crash.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from sessiond.errors import InvalidInput, NoSuchSession, Refused
from sessiond.log.store.pg.placement import Placement, PlacementFor, format_labels
from sessiond.replies import NodeMove, PsRow, Unplaced, WaitingSession
from sessiond.table.spec import GitTriggerSpec, SessionSpec, parse_spec

if TYPE_CHECKING:
    from sessiond.cluster.balance import Balancer
    from sessiond.cluster.coordination import Coordination
    from sessiond.cluster.host import Node
    from sessiond.log.store.base import Store
    from sessiond.table.sessions import Session

log = structlog.get_logger("sessiond.cluster")

HandOver = Callable[["Session", "str | None"], Awaitable["str | None"]]


class Placer:
    """The kernel's :class:`~sessiond.syscalls.seams.Placement` on a cluster node.
    Until :meth:`start` (the node takes part in the cluster) it adds nothing and
    moves nothing: ``ps`` and ``show`` are the local ones, and the take-over's
    sweep moves on what was made meanwhile."""

    def __init__(
        self,
        coordination: Coordination,
        store: Store,
        hand_over: HandOver,
        balancer: Balancer | None = None,
    ) -> None:
        self.coordination = coordination
        self.store = store
        self.hand_over = hand_over  # LeaseKeeper's: at a stable point, or let go
        self.balancer = balancer  # where a new session that may run here goes by load
        self.node: Node | None = None
        # Sessions a create is placing now: the sweep leaves them to it; and the
        # sweep's hand-overs under way, which a create that came second waits for.
        # Else the create could read the owner between the sweep's taking the
        # session out of the table and its hand-over's statement: this node.
        self._placing: set[str] = set()
        self._moving: dict[str, asyncio.Future[str | None]] = {}

    def start(self, node: Node) -> None:
        self.node = node

    async def waiting(self) -> list[PsRow]:
        """``ps`` rows of the sessions no live node runs."""
        if self.node is None:
            return []
        return [_row(w) for w in await asyncio.to_thread(self.coordination.waiting)]

    async def show_waiting(self, name: str) -> WaitingSession | None:
        """``show`` of a session no live node runs: what it waits for."""
        if self.node is None:
            return None
        found = await asyncio.to_thread(self.coordination.placement, name)
        if found is None or found[2]:
            return None  # no such session, or a live node runs it
        placed, owner, _ = found
        row = placeholder(name, "waiting", waiting_reason(placed, owner), placed.home or owner)
        waiting: WaitingSession = {**row, "program": None, "triggers": [], "seq": None}
        return waiting

    async def place(self, name: str) -> str | None:
        """A session just made here that may not run here goes now, and one that
        may goes to the least-loaded node it may run on (cluster/balance.py): the
        node it went to, or None (it stays, or waits for a node it fits)."""
        node = self.node
        if node is None:
            return None  # not in the cluster yet: the take-over's sweep moves it
        self._placing.add(name)
        try:
            return await self._place(node, name)
        finally:
            self._placing.discard(name)

    async def _place(self, node: Node, name: str) -> str | None:
        if name in await asyncio.to_thread(self.coordination.misplaced):
            s = node.table.sessions.get(name)
            if s is not None:
                moved = await self.hand_over(s, None)
                sweeping = self._moving.get(name)
                return moved if sweeping is None else await asyncio.shield(sweeping)
        s = node.table.sessions.get(name)
        if s is not None:
            return None if self.balancer is None else await self.balancer.place_new(s)
        # the take-over's sweep handed it over first: say where it went
        sweeping = self._moving.get(name)
        if sweeping is not None:
            return await asyncio.shield(sweeping)
        return await asyncio.to_thread(self.store.owner_of, name)

    async def sweep(self) -> None:
        """Each take-over tick: move on what this node holds and may not run."""
        assert self.node is not None  # started before the take-over
        for name in await asyncio.to_thread(self.coordination.misplaced):
            s = self.node.table.sessions.get(name)
            if s is None or s.run is not None or s.state in ("running", "ready"):
                continue  # not loaded here, or at its next stable point
            if name in self._placing:
                continue  # its create is placing it
            moving = self._moving[name] = asyncio.get_running_loop().create_future()
            try:
                moving.set_result(await self.hand_over(s, None))
            finally:
                if not moving.done():  # refused (it started meanwhile): it stays
                    moving.set_result(None)
                del self._moving[name]

    async def refusal(self, name: str, to: str) -> str | None:
        """Why ``name`` may not go to node ``to`` (None: it may, as far as placement goes)."""
        found, target = await asyncio.gather(
            asyncio.to_thread(self.coordination.placement, name),
            asyncio.to_thread(self.coordination.node_row, to),
        )
        if found is None or target is None:
            return None  # refused by the hand-over itself, with its own reason
        return found[0].refusal(to, target[2])

    async def rehome(self, name: str, to: str) -> NodeMove:
        """``migrate S --node N --force``. Only for a session nobody runs: a live
        owner hands it over at a stable point instead (without --force). Its pin
        and labels still hold; only where its workspace is changes. The epoch goes
        up with ``to``'s claim, so a node that comes back writes nothing of it."""
        me = self.coordination.node
        assert self.node is not None  # the take-over started it before it serves
        if name in self.node.table.sessions:
            raise Refused(
                f"session {name!r} runs on node {me!r}, which is up: --force is for a "
                f"session whose node is down; `sessionctl migrate {name} --node {to}` "
                "hands it over at a stable point"
            )
        found, target = await asyncio.gather(
            asyncio.to_thread(self.coordination.placement, name),
            asyncio.to_thread(self.coordination.node_row, to),
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
        if not await asyncio.to_thread(self.coordination.rehome, name, to):
            raise Refused(
                f"session {name!r} was not re-homed: its node came back or {to!r} went "
                "away meanwhile; `sessionctl ps` and `sessionctl nodes` say where things are"
            )
        log.warning("cluster.rehomed", session=name, node=to, was=placed.workspace_node)
        return {"session": name, "node": to, "rehomed": True, "was": placed.workspace_node}


def _row(w: Unplaced) -> PsRow:
    """A ``ps`` row of a session no live node runs."""
    return placeholder(w["name"], "waiting", w["reason"], w["node"])


def placeholder(name: str, state: str, reason: str | None, node: str | None) -> PsRow:
    """A ``ps`` row for a session no live node runs or answered for (here, and in
    cluster/forward.py's ``ps`` of the whole cluster)."""
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


def _under(path: str, shared: Sequence[Path]) -> bool:
    # the stored workspace is resolved (symlinks followed): so is each shared folder
    p = Path(path)
    roots = {r for root in shared for r in (root, Path(os.path.realpath(root)))}
    return any(p.is_relative_to(root) for root in roots)


def placement_of(spec: SessionSpec | None, *, here: str, shared: Sequence[Path]) -> Placement:
    """Where ``spec`` lets its session run, written on node ``here``: its pin
    (``node``), the labels it needs (``node_labels``), and the node its workspace
    lives on (``run.cwd`` and any git trigger's ``repo``), unless each of those lies
    under a ``[cluster] shared_paths`` folder or there is none."""
    if spec is None:
        return Placement()
    paths = [spec.run.cwd] if spec.run is not None else []
    paths += [t.repo for t in spec.trigger if isinstance(t, GitTriggerSpec)]
    local = [p for p in paths if not _under(p, shared)]
    workspace = (local or paths)[0] if paths else None
    pinned = spec.node
    return Placement(pinned, dict(spec.node_labels), workspace, (pinned or here) if local else None)


def placement_for(here: str, shared: Sequence[Path]) -> PlacementFor:
    """The store's ``placement_for`` on node ``here``: a stored spec's text, parsed
    as the table parses it (paths resolved already), to its placement."""
    folders = list(shared)

    def placed(text: str | None) -> Placement:
        if not text:
            return Placement()
        try:
            spec = parse_spec(text, base=Path("/"), source="spec.toml")
        except InvalidInput:
            return Placement()  # a spec that does not parse is refused elsewhere, with the reason
        return placement_of(spec, here=here, shared=folders)

    return placed


def waiting_reason(p: Placement, owner: str | None) -> str:
    """What a session nobody runs now waits for, as ``ps`` and ``show`` say it."""
    if p.pinned is not None:
        return f"waiting for node {p.pinned} (its spec pins it there)"
    if p.workspace_node is not None:
        return f"waiting for node {p.workspace_node} (its workspace {p.workspace} lives there)"
    if p.needs:
        return f"waiting for a node with labels {format_labels(p.needs)}"
    if owner is not None:
        return f"waiting for a node to take it over from node {owner}"
    return "waiting for a node to take it"
