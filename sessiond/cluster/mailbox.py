"""``send`` across the nodes of a cluster (docs/design.md section 10): the kernel's
:class:`~sessiond.syscalls.seams.Mail` seam, on the cluster's mail queue and
broker (sessiond.cluster.channels; on PostgreSQL the ``messages`` table and its
NOTIFY, cluster/pg/mail.py).

A send for a session this node does not have is left in the queue for its owner
(one statement, its wake-up with it), then flushed before it is acknowledged.
The owner hears the wake-up from the broker as soon as it comes, whatever a
delivery waits for (the broker's callback only queues it); a wake-up that
carries the message is delivered from it, one that does not (a long message,
or one from an older node) makes the owner read the queue. The owner reads the
queue anyway at least every :data:`POLL` seconds, and whenever the broker
(re)connects: the wake-up is the hint, the queue the truth.

Delivery is the local send (``Lineage.deliver``: the same wake as on one machine), whose
``message.received`` names the row (``message_id``): the commit that makes the
message durable marks the row taken in the same transaction (pg/once.py), so a
crash after the delivery cannot deliver it again, and a crash before leaves it
untaken for the next owner (exactly once). A message the session refuses (it
terminated) is marked taken on its own; one it could not take for another reason
(handed over while the delivery waited for its lock) is left for its next owner.
A message is delivered once by its node even when both its notification and a
poll bring it (``_seen``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import structlog

from sessiond.cluster.channels import Broker, Hint, Listening, MailQueue, Message, WakeUp
from sessiond.cluster.once import CARRIED
from sessiond.errors import InvalidInput, Refused
from sessiond.log.store.base import Store
from sessiond.log.store.pg.once import AlreadyFired
from sessiond.replies import Sent
from sessiond.table.sessions import Table

log = structlog.get_logger("sessiond.cluster")

# The backstop: the owner reads the table at least this often (seconds).
POLL = 1.0
# How many delivered ids a node remembers, to drop a message a poll and its
# notification both brought (far more than can be in flight at once).
SEEN = 4096

Send = Callable[..., Awaitable[Sent]]


class Mailbox:
    """This node's side of cross-node ``send``: it posts, and (once started) it
    delivers."""

    def __init__(self, store: Store, mail: MailQueue, broker: Broker) -> None:
        self.store = store  # which sessions the cluster has
        self.mail = mail
        self.broker = broker
        self.table: Table | None = None  # this node's sessions, once started
        self.local: Send | None = None  # the send to a session here, once started
        self._queue: asyncio.Queue[Message | Hint] = asyncio.Queue()
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe: Callable[[], None] | None = None

    def deliver_to(self, table: Table, local: Send) -> None:
        """Deliver what is left for the sessions of ``table``, through ``local``."""
        self.table, self.local = table, local

    def start(self, table: Table, local: Send) -> None:
        """Deliver to ``table`` (:meth:`deliver_to`), told by the broker and polling."""
        self.deliver_to(table, local)
        self._unsubscribe = self.broker.subscribe(self._heard, (Message, Hint, Listening))
        self._tasks = [asyncio.ensure_future(self._deliver())]

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        for task in self._tasks:
            task.cancel()

    async def post(self, to: str, text: str, sender: str) -> Sent | None:
        """``send`` for a session this node does not have: left for its owner.
        None: no node has it (the local send refuses it, as on one machine)."""
        posted = await self.mail.post(to, sender, text)
        if posted is None:
            return None
        await self.mail.flush(posted[0])  # on disk before the user hears of it (pg/mail.py)
        log.info("cluster.message_posted", session=to, owner=posted[1], message=posted[0])
        return {"session": to, "seq": None, "woke": None, "node": posted[1]}

    async def exists(self, name: str) -> bool:
        """Is ``name`` a session of the cluster (a program's ``run.send`` to it is
        recorded, then left for its owner)?"""
        try:
            return await asyncio.to_thread(self.store.exists, name)
        except InvalidInput:
            return False  # not a name: refused as on one machine

    # --- the owner's side --------------------------------------------------------

    def _heard(self, wake: WakeUp) -> None:
        """The broker's callback: queued, never waited for."""
        if isinstance(wake, Message | Hint):
            self._queue.put_nowait(wake)
        else:  # (re)connected: what was sent while nobody listened is in the queue only
            self._queue.put_nowait(Hint(None, None))

    async def _deliver(self) -> None:
        polled = time.monotonic()
        while True:
            try:
                got = await asyncio.wait_for(
                    self._queue.get(), timeout=max(0.0, polled + POLL - time.monotonic())
                )
            except TimeoutError:
                got = Hint(None, None)
            try:
                if isinstance(got, Message):
                    await self._one(got)
                if isinstance(got, Hint) or time.monotonic() >= polled + POLL:
                    polled = time.monotonic()
                    await self._poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the next poll tries again
                log.warning("cluster.mailbox_failed", error=repr(exc))
                await asyncio.sleep(POLL)

    async def _poll(self) -> None:
        assert self.table is not None  # started
        names = list(self.table.sessions)
        if names:
            for message in await self.mail.pending(names):
                await self._one(message)

    async def _one(self, message: Message) -> None:
        """Deliver a message to its session here, once; then mark it taken."""
        assert self.table is not None  # started
        assert self.local is not None
        if message.id in self._seen or message.session not in self.table.sessions:
            return  # delivered already, or not ours (its owner's poll finds it)
        self._seen[message.id] = None
        if len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        try:
            await self.local(
                message.session, message.text, message.sender, message_id=f"{CARRIED}{message.id}"
            )
            return  # taken with the message's commit
        except AlreadyFired:  # in the log already (a poll raced its commit): done
            return
        except (Refused, InvalidInput) as exc:  # the session's word (it terminated): dropped
            log.warning("cluster.message_refused", session=message.session, error=str(exc))
        except BaseException:
            # Not delivered and not refused (handed over or deleted meanwhile, the
            # log fenced or failed): left untaken, for the next owner or a poll. A
            # hand-over queued on the session's lock ahead of it closed the log.
            self._seen.pop(message.id, None)  # not delivered: a poll tries again
            raise
        await self.mail.taken(message.id)
