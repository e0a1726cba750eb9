"""How the nodes of a cluster talk to each other, beside what they agree on.

APScheduler 4 keeps its data store (what is scheduled, who has claimed which
job) apart from its event broker (who hears of what). The cluster floor does
the same: :class:`~sessiond.cluster.coordination.Coordination` is what the
nodes agree on (membership, take-overs, placement); this module is how they
reach each other, in two parts:

- the queues, durable: :class:`CarriedRequests` (a request for a session
  another node runs, left for its owner, taken once, answered) and
  :class:`MailQueue` (a message for a session another node runs, delivered
  once). A queue is the truth: a node that heard nothing still finds what is
  left for it by looking.
- the :class:`Broker`, only wake-ups: a request left, a request answered, a
  message left (the message itself when it fits), a session's events committed,
  a session followed. A wake-up can be lost (a node's listener reconnecting);
  what it costs is a look at the queue, which each part makes every second or so
  anyway. A queue publishes its own wake-ups when it writes (on PostgreSQL, in
  the same statement as the row, so no wake-up announces a row that is not
  there).

``pg/channels.py`` implements them on the cluster's PostgreSQL, and
tests/cluster/test_channels_contract.py is the contract each implementation
passes. The floor's parts use only these interfaces: ``forward.py`` (requests),
``mailbox.py`` (mail), ``follows.py`` (follow hints).

The queues' methods are synchronous where the node calls them in a thread (the
requests, on a small pool of their own) and asynchronous where it calls them
in the loop (the mail, on the store's pool), as each was before it had an
interface. A broker's callbacks run in the loop and must not block.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sessiond.replies import JsonObject, Who

# --- wake-ups (the broker's events) ----------------------------------------------


@dataclass(frozen=True)
class RequestLeft:
    """A request was left for some node: each looks for what is its own."""


@dataclass(frozen=True)
class RequestAnswered:
    """The request ``request`` was answered: its asker reads the reply."""

    request: int


@dataclass(frozen=True)
class Message:
    """One message for a session: its id in the queue, who sent it, its text.
    As a wake-up, it carries the message whole, so its owner delivers it
    without reading the queue first."""

    id: int
    session: str
    sender: str
    text: str


@dataclass(frozen=True)
class Hint:
    """A message was left, without the message (too long to carry, or a payload
    this version does not know): look in the queue (it may name one)."""

    id: int | None
    session: str | None


@dataclass(frozen=True)
class Committed:
    """A node committed events of ``session`` (for the followers on other nodes)."""

    session: str


@dataclass(frozen=True)
class Followed:
    """A node has a follower of ``session`` (so its owner says when it commits)."""

    session: str


@dataclass(frozen=True)
class Listening:
    """The broker listens (again): what was published while it did not is lost to
    it. Never published; each subscriber that asks for it gets it at each
    (re)connection, and looks at its queue."""


# What a node may publish; ``Listening`` is the broker's own.
Published = RequestLeft | RequestAnswered | Message | Hint | Committed | Followed
WakeUp = Published | Listening


class Broker(ABC):
    """Wake-ups between the nodes: published by one, heard by every node that
    listens (the publisher too)."""

    @abstractmethod
    def start(self) -> None:
        """Listen from now on (in the loop), and again after each failure."""

    @abstractmethod
    async def close(self) -> None:
        """Stop listening; no callback is called afterwards."""

    @abstractmethod
    async def publish(self, events: Sequence[Published]) -> None:
        """Publish ``events`` to every node, in order. Raises what the backend
        raises when it is away (the caller tries again later)."""

    @abstractmethod
    def subscribe(
        self, callback: Callable[[WakeUp], None], kinds: tuple[type[WakeUp], ...]
    ) -> Callable[[], None]:
        """Call ``callback`` (in the loop) with each wake-up of one of ``kinds``,
        until the returned function is called."""


# --- carried requests --------------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """Who owns a session now, as the queue's backend says."""

    node: str | None  # None: nobody (it waits for a node to claim it)
    alive: bool  # the owner's lease runs
    state: str | None  # the owner's state: up, draining, stopped


@dataclass(frozen=True)
class Status:
    """Where a request is: not taken yet, taken (by a node alive or not), answered."""

    taken_by: str | None
    reply: JsonObject | None
    abandoned: bool
    taker_alive: bool


class CarriedRequests(ABC):
    """Requests for sessions other nodes run, carried to their owners.

    A request is carried out at most once: taking it is the only way to run it,
    and a request nobody took can be abandoned by its asker (then nobody takes
    it). Leaving one publishes :class:`RequestLeft`; answering one publishes
    :class:`RequestAnswered`. Every method speaks for one node (:attr:`node`) and
    is called in a thread."""

    node: str  # the node it speaks for

    @abstractmethod
    def open(self) -> None:
        """Connect (once the node serves)."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def post(
        self,
        method: str,
        params: Mapping[str, object],  # any JSON orjson encodes
        who: Who | None,
        *,
        session: str | None = None,
        node: str | None = None,
    ) -> int | None:
        """Leave a request for ``session``'s owner (or for ``node``); its id, or
        None when the cluster has no such session. Raises InvalidInput for a name
        that cannot be a session's."""

    @abstractmethod
    def take(
        self, incarnation: int, names: list[str]
    ) -> list[tuple[int, str, JsonObject, Who | None]]:
        """Take what this node should carry out now, those for ``names`` (the
        sessions it has) and those addressed to it: (id, method, params, who)
        each. Nobody else takes them."""

    @abstractmethod
    def answer(self, request: int, reply: JsonObject) -> None:
        """Write the reply of a request this node took, and tell its asker."""

    @abstractmethod
    def status(self, request: int) -> Status: ...

    @abstractmethod
    def abandon(self, request: int) -> bool:
        """Withdraw a request nobody took yet; False when it was taken meanwhile."""

    @abstractmethod
    def forget(self, request: int) -> None:
        """Drop a request its asker is done with (answered, or withdrawn untaken)."""

    # --- whom to ask ----------------------------------------------------------------

    @abstractmethod
    def owner(self, session: str) -> Owner | None:
        """The session's owner, or None when the cluster has no such session."""

    @abstractmethod
    def sessions(self) -> list[tuple[str, str | None, bool, str | None]]:
        """Every session of the cluster: (name, owner, owner alive, owner's state)."""

    @abstractmethod
    def live_nodes(self) -> list[str]:
        """The nodes whose lease runs, but this one."""


# --- mail ------------------------------------------------------------------------


class MailQueue(ABC):
    """Messages for sessions other nodes run. Leaving one publishes it (a
    :class:`Message`, or a :class:`Hint` when it is too long to carry). Called
    in the loop."""

    @abstractmethod
    async def post(self, to: str, sender: str, text: str) -> tuple[int, str | None] | None:
        """Leave a message for ``to``: (its id, the owner when it was left), or
        None when the cluster has no such session. Not durable yet: :meth:`flush`
        before saying so. Raises Refused for a terminated session."""

    @abstractmethod
    async def flush(self, message: int) -> None:
        """Return once the message :meth:`post` left is durable."""

    @abstractmethod
    async def pending(self, names: list[str], limit: int = 100) -> list[Message]:
        """Messages not yet taken for any of ``names``, oldest first."""

    @abstractmethod
    async def taken(self, message: int) -> None:
        """Mark a message delivered (once; a second mark changes nothing)."""


@dataclass(frozen=True)
class Channels:
    """A node's channels to the others, made with its store and coordination
    (``lease.make_store``)."""

    broker: Broker
    requests: CarriedRequests
    mail: MailQueue
