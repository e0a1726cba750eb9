"""What the nodes of a cluster agree on beside their sessions' store.

The split is APScheduler 4's between its data store and its event broker: the
store (sessiond.log.store: events, snapshots, artifacts, specs, and on a
cluster the lease and epochs that fence every append, the way APScheduler's
store leases the jobs it hands out) keeps what a session *is*; coordination
keeps what the nodes do *about* each other: who is up and who drains, which
sessions a node should take over, hand over or let go, and where a spec lets a
session run. How the nodes reach each other (requests carried to a session's
owner, messages for its sessions, wake-ups: APScheduler's event broker) is the
other half of coordination, behind its own interfaces in ``channels.py``.

:class:`Coordination` is the interface; ``pg/coordination.py`` implements it on
the cluster's PostgreSQL, and tests/cluster/test_coordination_contract.py is
the contract each implementation passes. A new backend (another database, a
consensus service) implements this, the channels (``channels.py``) and the
store's interface (sessiond.log.store.base.Store), and ``lease.make_store``
chooses it.

Every method is synchronous (a node calls them off its loop, in a thread) and
speaks for the node it was made for (:attr:`node`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from sessiond.log.store.pg.placement import Placement
from sessiond.replies import NodeRow, Unplaced


class Coordination(ABC):
    """One node's view of the cluster's coordination."""

    node: str  # the node it speaks for

    # --- membership ----------------------------------------------------------------

    @abstractmethod
    def nodes(self) -> list[NodeRow]:
        """Every node, as ``sessionctl nodes`` lists it: name, incarnation, state
        (up, draining, stopped, lapsed), alive, its lease's age and time left,
        labels, how many sessions it owns, whether it is this node, its load as it
        last said it (running, ready, max_running) and its fair share of the
        sessions (cluster/balance.py's ``fair_shares``)."""

    @abstractmethod
    def publish(self, running: int, ready: int, max_running: int) -> None:
        """Say this node's load (cluster/balance.py): its programs running, its
        sessions waiting ready for a slot, its slots. ``nodes`` lists it."""

    @abstractmethod
    def node_row(self, name: str) -> tuple[bool, str, dict[str, str]] | None:
        """(alive, state, labels) of node ``name``; None: no such node."""

    @abstractmethod
    def drain(self, node: str) -> int | None:
        """Mark ``node`` draining (it hands its sessions to the others itself); how
        many sessions it has, or None when no live node has that name."""

    # --- ownership -----------------------------------------------------------------

    @abstractmethod
    def orphans(self, limit: int = 100) -> list[str]:
        """Sessions this node should take: those handed to it, and those it is
        dealt. Nobody's sessions and those of nodes whose lease lapsed (up to
        ``limit`` at a time) are dealt first to the live nodes they may run on, each
        to the least loaded (cluster/balance.py's ``least_loaded``), so that a dead
        node's sessions spread over the survivors instead of going to one."""

    @abstractmethod
    def hand_over(self, name: str, to: str | None) -> str | None:
        """Give ``name`` (this node's) to node ``to``, or to the live node it fits
        with the fewest sessions that is not draining; its epoch goes up. The node
        it went to, or None when no such node is alive."""

    @abstractmethod
    def release(self, name: str) -> bool:
        """Let go of ``name`` (this node's) for the node it fits to claim; its epoch
        goes up. False: it was not this node's."""

    @abstractmethod
    def target_for(self, name: str, to: str | None) -> str | None:
        """The live node that is up, not this one, that ``name`` may run on: ``to``,
        or the one with the fewest sessions. None: there is none."""

    @abstractmethod
    def rehome(self, name: str, to: str) -> bool:
        """Say that the workspace of ``name``, whose node is down, is on ``to`` now
        (``migrate --node --force``). False: it runs again somewhere, or ``to`` may
        not run it."""

    # --- placement -----------------------------------------------------------------

    @abstractmethod
    def placement(self, name: str) -> tuple[Placement, str | None, bool] | None:
        """A session's placement, its owner and whether that owner's lease runs
        (None: no such session)."""

    @abstractmethod
    def waiting(self) -> list[Unplaced]:
        """The sessions no live node runs: name, the node it waits for, and why."""

    @abstractmethod
    def misplaced(self) -> list[str]:
        """This node's sessions it may not run (to hand over at a stable point)."""

    @abstractmethod
    def movable(self) -> list[str]:
        """This node's sessions that may run elsewhere."""

    @abstractmethod
    def homed_on(self, node: str) -> int:
        """How many sessions run only on ``node`` (pinned there, or their workspace is)."""
