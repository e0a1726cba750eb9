"""The cluster's channels on its PostgreSQL (sessiond.cluster.channels).

The queues are tables of the store's database: ``requests.py`` (carried
requests) and ``mail.py`` (messages). The broker is LISTEN/NOTIFY on that same
database, one channel per kind of wake-up, named as nodes of every version name
them (a node of an older version still hears and is heard):

============================  ====================  ==========================
wake-up                       channel               payload
============================  ====================  ==========================
``RequestLeft``               ``sessiond_requests``  empty: look
``RequestAnswered``           ``sessiond_replies``   the request's id
``Message`` / ``Hint``        ``sessiond_messages``  JSON: the message, or its id
``Committed``                 ``sessiond_events``    the session's name
``Followed``                  ``sessiond_follows``   the session's name
============================  ====================  ==========================

The queues NOTIFY in the same transaction as the row they write (a NOTIFY is
delivered at commit, and only if it commits), so a wake-up never announces a
row that is not there. The broker publishes the rest (the follow hints) on a
connection of its own: every notifying commit takes a cluster-wide lock, which
the store's appends must not queue behind.

One connection LISTENs on every channel and does nothing else, so a wake-up is
read as soon as it comes, whatever its subscribers are doing (each only queues
it or sets an event). When it fails it connects again after a second, and tells
the subscribers that ask for it (``Listening``) that they may have missed some.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import psycopg
import structlog

from sessiond.cluster.channels import (
    Broker,
    Channels,
    Committed,
    Followed,
    Hint,
    Listening,
    Message,
    Published,
    RequestAnswered,
    RequestLeft,
    WakeUp,
)
from sessiond.cluster.pg import mail
from sessiond.cluster.pg.mail import PgMail
from sessiond.cluster.pg.requests import REPLIES, REQUESTS, Requests
from sessiond.log.store.pg.pgstore import PgStore

log = structlog.get_logger("sessiond.cluster")

EVENTS = "sessiond_events"
FOLLOWS = "sessiond_follows"
CHANNELS = (REQUESTS, REPLIES, mail.CHANNEL, EVENTS, FOLLOWS)

# One statement a channel, however many payloads (a burst of commits is one).
NOTIFY = "SELECT pg_notify(%s, n) FROM unnest(%s::text[]) AS n"

RETRY = 1.0  # seconds before the listener connects again


def channel_of(event: Published) -> tuple[str, str]:
    """(channel, payload) of a wake-up."""
    if isinstance(event, RequestLeft):
        return REQUESTS, ""  # one payload for everyone: the hint says "look"
    if isinstance(event, RequestAnswered):
        return REPLIES, str(event.request)
    if isinstance(event, Message | Hint):
        return mail.CHANNEL, mail.payload(event)
    if isinstance(event, Committed):
        return EVENTS, event.session
    return FOLLOWS, event.session


def event_of(channel: str, payload: str) -> Published | None:
    """The wake-up a notification says; None: one this version does not know."""
    if channel == REQUESTS:
        return RequestLeft()
    if channel == REPLIES:
        return RequestAnswered(int(payload)) if payload.isdigit() else None
    if channel == mail.CHANNEL:
        return mail.parse(payload)
    if channel == EVENTS:
        return Committed(payload)
    if channel == FOLLOWS:
        return Followed(payload)
    return None


Subscriber = tuple[Callable[[WakeUp], None], tuple[type[WakeUp], ...]]


class PgBroker(Broker):
    """LISTEN/NOTIFY on the cluster's database."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._subscribers: dict[object, Subscriber] = {}
        self._listener: asyncio.Task[None] | None = None
        self._publisher: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._publishing = asyncio.Lock()

    def start(self) -> None:
        self._listener = asyncio.ensure_future(self._listen())

    async def close(self) -> None:
        self._subscribers.clear()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        async with self._publishing:
            if self._publisher is not None:
                await self._publisher.close()
                self._publisher = None

    def subscribe(
        self, callback: Callable[[WakeUp], None], kinds: tuple[type[WakeUp], ...]
    ) -> Callable[[], None]:
        token = object()
        self._subscribers[token] = (callback, kinds)

        def unsubscribe() -> None:
            self._subscribers.pop(token, None)

        return unsubscribe

    async def publish(self, events: Sequence[Published]) -> None:
        # consecutive wake-ups of one channel in one statement, in order
        runs: list[tuple[str, list[str]]] = []
        for event in events:
            channel, payload = channel_of(event)
            if runs and runs[-1][0] == channel:
                runs[-1][1].append(payload)
            else:
                runs.append((channel, [payload]))
        if not runs:
            return
        async with self._publishing:
            try:
                if self._publisher is None or self._publisher.closed:
                    self._publisher = await psycopg.AsyncConnection.connect(
                        self.dsn, autocommit=True
                    )
                for channel, payloads in runs:
                    await self._publisher.execute(NOTIFY, (channel, payloads))
            except BaseException:
                # the database away, or cancelled mid-statement: a new connection next time
                if self._publisher is not None:
                    with contextlib.suppress(Exception):
                        await self._publisher.close()
                    self._publisher = None
                raise

    def _tell(self, event: WakeUp) -> None:
        for callback, kinds in list(self._subscribers.values()):
            if isinstance(event, kinds):
                try:
                    callback(event)
                except Exception:  # one subscriber's bug: the others still hear
                    log.exception("cluster.wake_up_failed", wake_up=repr(event))

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                    for channel in CHANNELS:
                        await conn.execute(f"LISTEN {channel}")
                    # what was published while nobody listened is in the queues only
                    self._tell(Listening())
                    async for note in conn.notifies():
                        event = event_of(note.channel, note.payload)
                        if event is not None:
                            self._tell(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the parts poll meanwhile
                log.warning("cluster.broker_failed", error=repr(exc))
                await asyncio.sleep(RETRY)


def pg_channels(store: PgStore, *, prepared: bool = True) -> Channels:
    """The channels of ``store``'s node, on its database (nothing connects yet)."""
    return Channels(
        broker=PgBroker(store.dsn),
        requests=Requests(store.dsn, node=store.lease.name, prepared=prepared),
        mail=PgMail(store),
    )
