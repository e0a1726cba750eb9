"""Placement by load on a cluster (docs/design.md section 10, "Placement by load").

A node's load is what it runs and what waits for it: its programs running plus
its sessions waiting ``ready`` for a slot, against its slots (``max_running``);
and the sessions it holds. Every ``[cluster] placement_interval`` each node says
its load (the ``nodes`` row: ``running``, ``ready``, ``max_running``), and

- a new session (``create``) goes to the least-loaded node it may run on
  (:func:`least_loaded`; cluster/placement.py's ``place``), and so does a dead
  node's session (coordination deals them out: ``orphans``);
- a session waiting ``ready`` here goes to a node it may run on that has a free
  slot (:meth:`Balancer._to_free_slots`), so none waits while a slot is free;
- a node holding more than its fair share (:func:`fair_shares`: the sessions of
  the live nodes, spread evenly) hands the excess to nodes under theirs
  (:meth:`Balancer._even_out`): so a node that joins or returns takes its share back.

Sessions move only at a stable point (:func:`settled`: no run, no call waiting
for an answer, no wake being handled), by the existing hand-over (its triggers
disarmed, its log closed, the owner and epoch changed in one statement), and at
most ``moves_per_interval`` per interval: a node that comes and goes moves a
bounded number of sessions, and a receiving node never goes above its share, so
nothing moves back and forth.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from sessiond.errors import SessiondError

if TYPE_CHECKING:
    from sessiond.cluster.coordination import Coordination
    from sessiond.cluster.host import Node
    from sessiond.log.store.pg.placement import Placement
    from sessiond.replies import NodeRow
    from sessiond.table.sessions import Session

log = structlog.get_logger("sessiond.cluster")

# LeaseKeeper's hand-over: (session, to, ready too) -> the node it went to, or None
Move = Callable[["Session", str, bool], Awaitable["str | None"]]


@dataclass
class Load:
    """One live node that takes sessions (up, not draining), as placement compares it."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    sessions: int = 0
    running: int = 0
    ready: int = 0
    max_running: int = 1

    @property
    def slots(self) -> int:
        return max(self.max_running, 1)

    @property
    def free(self) -> int:
        """Slots no program runs in and no ready session waits for."""
        return max(self.slots - self.running - self.ready, 0)

    def key(self) -> tuple[bool, float, float]:
        """Smaller is less loaded: a node with a free slot before a full one; then
        the fewest sessions (the share is even: what the fleet is judged by); then
        the fewest running and ready for its slots."""
        return (self.free == 0, self.sessions, (self.running + self.ready) / self.slots)


def loads_of(rows: list[NodeRow]) -> dict[str, Load]:
    """The nodes of ``rows`` that take sessions, by name: alive, up, and started (it
    has said its load, which its take-over starts with: one still loading its
    table would leave what it is given unclaimed meanwhile; each start of a node
    clears what its last one said)."""
    return {
        r["name"]: Load(
            r["name"],
            dict(r["labels"]),
            r["sessions"],
            r.get("running", 0),
            r.get("ready", 0),
            r.get("max_running", 0),
        )
        for r in rows
        if r["alive"] and r["state"] == "up" and r.get("max_running", 0) > 0
    }


def fair_shares(rows: list[NodeRow]) -> dict[str, float]:
    """The sessions each node should hold: every session of the live nodes (a
    draining node's too: they are leaving it), spread evenly over the nodes that
    take sessions (how busy each is decides where a new one goes, not how many
    it holds). 0 for a node that takes none."""
    loads = loads_of(rows)
    total = sum(r["sessions"] for r in rows if r["alive"])
    return {r["name"]: (total / len(loads) if r["name"] in loads else 0.0) for r in rows}


def least_loaded(loads: list[Load], placed: Placement, prefer: str | None = None) -> Load | None:
    """The least-loaded of ``loads`` that ``placed`` may run on; on a tie, ``prefer``
    (the node asking: nothing moves for nothing), then by name."""
    fits = [ld for ld in loads if placed.refusal(ld.name, ld.labels) is None]
    if not fits:
        return None
    return min(fits, key=lambda ld: (ld.key(), ld.name != prefer, ld.name))


def settled(s: Session, queued: bool = False) -> bool:
    """``s`` is at a stable point: no run, none starting, no wake being handled
    (its lock is free), no call waiting for an answer (blocked), no turn left open;
    with ``queued``, a session waiting ``ready`` for a slot counts too (it has
    passed its gate and holds nothing: the next node's gate decides again)."""
    if s.run is not None or s.lock.locked() or s.journal_or_none is None:
        return False
    if s.state == "ready":
        return queued
    return s.state in ("created", "sleeping", "suspended", "terminated") and (
        s.journal.state.turn is None
    )


class Balancer:
    """Says this node's load and evens out the cluster's, once :meth:`start` is called."""

    def __init__(
        self, coordination: Coordination, move: Move, *, interval: float, moves: int
    ) -> None:
        self.coordination = coordination
        self.move = move
        self.interval = interval
        self.moves = moves  # per interval; 0: nothing moves for load
        self.node: Node | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, node: Node) -> None:
        self.node = node
        self._task = asyncio.ensure_future(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def here(self) -> tuple[int, int, int]:
        """This node's (running, ready, max_running) now."""
        assert self.node is not None
        scheduler = self.node.kernel.ctx.scheduler
        running = sum(1 for s in self.node.table if s.run is not None)
        running += len(scheduler.starting)
        return running, len(scheduler.queue), scheduler.limit

    async def _loop(self) -> None:
        first = True  # its load said at once: the others place by it from now on
        while True:
            if not first:
                await asyncio.sleep(self.interval)
            first = False
            try:
                await self.tick()
            except Exception as exc:  # the database is away: the lease keeper decides
                log.warning("cluster.balance_failed", error=repr(exc))

    async def tick(self) -> None:
        """Say this node's load; then move what should move, within the rate."""
        await asyncio.to_thread(self.coordination.publish, *self.here())
        if self.moves <= 0 or self.node is None or self.node.kernel.stopping:
            return
        rows = await asyncio.to_thread(self.coordination.nodes)
        loads = loads_of(rows)
        me = loads.get(self.coordination.node)
        if me is None:
            return  # draining (it hands everything over by itself), or not up
        me.running, me.ready, me.max_running = self.here()
        budget = await self._to_free_slots(me, loads, self.moves)
        if budget > 0:
            await self._even_out(me, loads, fair_shares(rows), budget)

    async def place_new(self, s: Session) -> str | None:
        """A session just made here goes to the least-loaded node it may run on
        (this one on a tie). The node it went to, or None: it stays."""
        if self.moves <= 0 or self.node is None:
            return None
        rows, found = await asyncio.gather(
            asyncio.to_thread(self.coordination.nodes),
            asyncio.to_thread(self.coordination.placement, s.name),
        )
        loads = loads_of(rows)
        me = loads.get(self.coordination.node)
        if found is None or me is None:
            return None
        me.running, me.ready, me.max_running = self.here()
        me.sessions -= 1  # it is counted here already: compare the nodes without it
        best = least_loaded(list(loads.values()), found[0], prefer=me.name)
        if best is None or best is me or not settled(s):
            return None
        return await self._move(s, best.name, queued=False)

    async def _to_free_slots(self, me: Load, loads: dict[str, Load], budget: int) -> int:
        """Sessions waiting ``ready`` here go to nodes with a free slot; what is
        left of ``budget``."""
        assert self.node is not None
        others = [ld for ld in loads.values() if ld is not me and ld.free > 0]
        if not others:
            return budget
        for s in self.node.kernel.ctx.scheduler.order():
            if budget <= 0 or not any(ld.free > 0 for ld in others):
                break
            if not settled(s, queued=True):
                continue
            found = await asyncio.to_thread(self.coordination.placement, s.name)
            if found is None:
                continue
            target = least_loaded([ld for ld in others if ld.free > 0], found[0])
            if target is None:
                continue
            if await self._move(s, target.name, queued=True) is not None:
                budget -= 1
                target.ready += 1
                target.sessions += 1
                me.sessions -= 1
        return budget

    async def _even_out(
        self, me: Load, loads: dict[str, Load], shares: dict[str, float], budget: int
    ) -> None:
        """Above its fair share, this node hands sessions to nodes under theirs."""
        assert self.node is not None

        def room(ld: Load) -> bool:  # it may take one more and stay within its share
            return ld is not me and ld.sessions + 1 <= math.ceil(shares.get(ld.name, 0.0))

        if me.sessions <= math.ceil(shares.get(me.name, 0.0)):
            return
        if not any(room(ld) for ld in loads.values()):
            return
        movable = set(await asyncio.to_thread(self.coordination.movable))
        tried = 0
        for name in sorted(movable):
            if budget <= 0 or tried >= 4 * self.moves:
                return
            if me.sessions <= math.ceil(shares.get(me.name, 0.0)):
                return
            s = self.node.table.sessions.get(name)
            if s is None or not settled(s):
                continue
            tried += 1
            found = await asyncio.to_thread(self.coordination.placement, name)
            targets = [ld for ld in loads.values() if room(ld)]
            target = None if found is None else least_loaded(targets, found[0])
            if target is None:
                continue
            if await self._move(s, target.name, queued=False) is not None:
                budget -= 1
                target.sessions += 1
                me.sessions -= 1

    async def _move(self, s: Session, to: str, *, queued: bool) -> str | None:
        try:
            moved = await self.move(s, to, queued)
        except SessiondError as exc:  # it started meanwhile: at its next stable point
            log.info("cluster.balance_skipped", session=s.name, error=str(exc))
            return None
        if moved is not None:
            log.info("cluster.balanced", session=s.name, to=moved, ready=queued)
        return moved
