"""The contract of the cluster's channels (sessiond.cluster.channels): the broker,
the carried requests and the mail queue, run against each implementation (today
PostgreSQL, on a real server), as coordination's is
(tests/cluster/test_coordination_contract.py).

Each implementation comes with the store its node uses (the store makes the
sessions the channels address). A test speaks to the channels through their
interfaces only; waits are on what a node hears, bounded only to catch a hang.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import psycopg
import pytest

from sessiond.cluster.channels import (
    Channels,
    Committed,
    Followed,
    Hint,
    Listening,
    Message,
    Owner,
    Published,
    RequestAnswered,
    RequestLeft,
    WakeUp,
)
from sessiond.cluster.once import CARRIED, keys_of
from sessiond.cluster.pg.channels import pg_channels
from sessiond.errors import InvalidInput, Refused
from sessiond.log.event_data import LifecycleChanged, MessageReceived
from sessiond.log.store.base import Store
from sessiond.log.store.pg.pgstore import PgStore
from sessiond.replies import JsonObject, Who
from tests.cluster.test_fencing import lapse
from tests.helpers import arun

HANG = 30.0  # seconds: only a hang takes this long
PUBLISHED = (RequestLeft, RequestAnswered, Message, Hint, Committed, Followed)
WHO: Who = {"uid": 1000, "user": "ann", "channel": "cli"}
# under any payload limit as text, over one once carried as JSON (each \x01 is 6 bytes)
LONG = "\x01" * 7000


@dataclass
class Heard:
    """What a node's broker told one subscriber, in order."""

    got: list[WakeUp] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, wake: WakeUp) -> None:
        self.got.append(wake)
        self.changed.set()

    async def until(self, found: Callable[[list[WakeUp]], bool]) -> list[WakeUp]:
        async def wait() -> None:
            while not found(self.got):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), HANG)
        return self.got

    async def heard(self, wake: WakeUp) -> None:
        await self.until(lambda got: wake in got)


@dataclass
class Member:
    """One node: its store, its channels, and what its broker told it."""

    name: str
    store: Store
    channels: Channels
    heard: Heard


# (where, how to make a member there): a database's DSN and a node's name
Backend = tuple[str, Callable[[str, str], AbstractAsyncContextManager[Member]]]


@asynccontextmanager
async def pg_member(dsn: str, name: str) -> AsyncIterator[Member]:
    store = PgStore(dsn, node=name, lease_ttl=60, keys_of=keys_of)
    await store.connect()  # registers the node (a new incarnation)
    channels = pg_channels(store)
    heard = Heard()
    channels.broker.subscribe(heard, (*PUBLISHED, Listening))
    channels.requests.open()
    channels.broker.start()
    try:
        await heard.heard(Listening())  # from now on it hears what is published
        yield Member(name, store, channels, heard)
    finally:
        await channels.broker.close()
        channels.requests.close()
        await store.aclose()


@pytest.fixture(params=["postgresql"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """(where, how to make a member there) for each implementation."""
    if request.param == "postgresql":
        return request.getfixturevalue("pg_dsn"), pg_member
    raise AssertionError(request.param)


async def made(m: Member, name: str) -> None:
    log = await m.store.create(name)
    await log.close()


# --- the broker ------------------------------------------------------------------


def test_every_wake_up_one_node_publishes_is_heard_by_every_node_equal_and_in_order(
    backend: Backend,
) -> None:
    where, member = backend
    said: list[Published] = [
        Followed("w"),
        Committed("w"),
        Committed("v"),
        RequestLeft(),
        RequestAnswered(7),
        Message(1, "w", 'b\'s "sender"', 'quotes " \\ a tab\t, a newline\n, ü, \U0001f600'),
        Hint(2, "w"),
        Followed("v"),
    ]

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await a.channels.broker.publish(said)
            for m in (a, b):  # the publisher hears it too
                got = await m.heard.until(lambda got: len(got) > len(said))
                assert got[1:] == said

    arun(go())


def test_a_message_too_long_to_carry_is_heard_as_a_hint_naming_it(backend: Backend) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await a.channels.broker.publish([Message(3, "w", "s", LONG), Committed("end")])
            got = await b.heard.until(lambda got: Committed("end") in got)
            assert got[1:] == [Hint(3, "w"), Committed("end")]

    arun(go())


def test_a_subscriber_hears_only_its_kinds_and_nothing_once_it_unsubscribed(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            commits = Heard()
            unsubscribe = b.channels.broker.subscribe(commits, (Committed,))
            await a.channels.broker.publish([Followed("x"), Committed("x"), RequestLeft()])
            await b.heard.heard(RequestLeft())  # heard in order: every one before too
            assert commits.got == [Committed("x")]
            unsubscribe()
            await a.channels.broker.publish([Committed("y"), Followed("end")])
            await b.heard.heard(Followed("end"))
            assert commits.got == [Committed("x")]

    arun(go())


# --- carried requests ------------------------------------------------------------


def test_a_request_is_left_for_its_sessions_owner_taken_once_and_answered(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await made(a, "s1")
            asks, owns = b.channels.requests, a.channels.requests
            request = asks.post("show", {"name": "s1", "at": "ü"}, WHO, session="s1")
            assert request is not None
            await a.heard.heard(RequestLeft())
            assert asks.take(1, []) == []  # not b's session, nor addressed to b
            taken = owns.take(1, ["s1"])
            assert taken == [(request, "show", {"name": "s1", "at": "ü"}, WHO)]
            assert owns.take(1, ["s1"]) == []  # taken once
            st = asks.status(request)
            assert (st.taken_by, st.reply, st.abandoned, st.taker_alive) == ("a", None, False, True)
            assert not asks.abandon(request)  # taken: too late to withdraw
            reply: JsonObject = {"ok": True, "result": {"name": "s1", "n": [1, 2]}}
            owns.answer(request, reply)
            await b.heard.heard(RequestAnswered(request))
            assert asks.status(request).reply == reply
            asks.forget(request)  # done with: the queue stays small

    arun(go())


def test_a_request_addressed_to_a_node_can_be_withdrawn_until_it_is_taken(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            asks, owns = b.channels.requests, a.channels.requests
            first = asks.post("ps", {}, None, node="a")
            assert first is not None
            assert asks.abandon(first)
            assert asks.status(first).abandoned
            assert owns.take(1, []) == []  # withdrawn: nobody takes it
            asks.forget(first)
            second = asks.post("ps", {}, WHO, node="a")
            assert owns.take(1, []) == [(second, "ps", {}, WHO)]
            assert second is not None
            assert not asks.abandon(second)

    arun(go())


def test_a_request_for_a_session_the_cluster_does_not_have_is_not_left(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a:
            assert a.channels.requests.post("show", {}, WHO, session="nobody") is None
            with pytest.raises(InvalidInput):
                a.channels.requests.post("show", {}, WHO, session="../x")
            assert a.channels.requests.owner("nobody") is None

    arun(go())


def test_the_asker_sees_whom_to_ask_and_a_taker_whose_lease_lapsed(backend: Backend) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await made(a, "s1")
            asks = b.channels.requests
            assert asks.owner("s1") == Owner("a", True, "up")
            assert asks.sessions() == [("s1", "a", True, "up")]
            assert asks.live_nodes() == ["a"]  # not itself
            request = asks.post("show", {}, WHO, session="s1")
            assert request is not None
            assert [t[0] for t in a.channels.requests.take(1, ["s1"])] == [request]
            lapse(where, "a")
            st = asks.status(request)
            assert (st.taken_by, st.reply, st.taker_alive) == ("a", None, False)
            assert asks.owner("s1") == Owner("a", False, "up")
            assert asks.live_nodes() == []

    arun(go())


# --- mail ----------------------------------------------------------------------


def test_a_message_is_left_heard_whole_and_pending_until_taken(backend: Backend) -> None:
    where, member = backend
    text = 'quotes " and \\ and a tab\t, a newline\n, ü, and an emoji \U0001f600'

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await made(a, "w")
            posted = await b.channels.mail.post("w", "b's sender", text)
            assert posted is not None
            message, owner = posted
            assert owner == "a"  # the owner when it was left
            await b.channels.mail.flush(message)
            whole = Message(message, "w", "b's sender", text)
            await a.heard.heard(whole)
            assert await a.channels.mail.pending(["w", "other"]) == [whole]
            await a.channels.mail.taken(message)
            await a.channels.mail.taken(message)  # once; again changes nothing
            assert await a.channels.mail.pending(["w"]) == []

    arun(go())


def test_a_message_too_long_to_carry_is_announced_and_read_whole_from_the_queue(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await made(a, "w")
            posted = await b.channels.mail.post("w", "s", LONG)
            assert posted is not None
            await a.heard.heard(Hint(posted[0], "w"))
            assert await a.channels.mail.pending(["w"]) == [Message(posted[0], "w", "s", LONG)]

    arun(go())


def test_messages_are_pending_oldest_first_until_their_delivery_is_in_the_log(
    backend: Backend,
) -> None:
    """Exactly once: the commit that puts a carried message in its session's log
    takes it from the queue (sessiond.cluster.once)."""
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            log = await a.store.create("w")
            ids = []
            texts = ("one", "two", "three")
            for text in texts:
                posted = await b.channels.mail.post("w", "s", text)
                assert posted is not None
                ids.append(posted[0])
            pending = await a.channels.mail.pending(["w"])
            assert [(m.id, m.text) for m in pending] == list(
                zip(ids, ("one", "two", "three"), strict=True)
            )
            await log.append(
                MessageReceived(sender="s", text="two", message_id=f"{CARRIED}{ids[1]}")
            )
            await log.close()
            assert [m.id for m in await a.channels.mail.pending(["w"], limit=5)] == [ids[0], ids[2]]
            assert [m.id for m in await a.channels.mail.pending(["w"], limit=1)] == [ids[0]]

    arun(go())


def test_no_message_is_left_for_a_session_missing_or_terminated(backend: Backend) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            assert await b.channels.mail.post("nobody", "s", "hi") is None
            log = await a.store.create("done")
            await log.append(LifecycleChanged(to="terminated"))
            await log.close()
            with pytest.raises(Refused, match="terminated"):
                await b.channels.mail.post("done", "s", "hi")
            assert await a.channels.mail.pending(["done", "nobody"]) == []

    arun(go())


# --- PostgreSQL's own ---------------------------------------------------------------


def test_the_postgresql_broker_listens_again_when_its_connection_is_cut_and_says_so(
    pg_dsn: str,
) -> None:
    """A notification sent while the listener reconnects is lost: the subscribers
    are told (``Listening``), so that they look at their queues."""

    async def go() -> None:
        async with pg_member(pg_dsn, "a") as a:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                cut = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query LIKE 'LISTEN %'"
                ).fetchall()
            assert cut == [(True,)]  # the node's one listening connection
            await a.heard.until(lambda got: got.count(Listening()) == 2)
            await a.channels.broker.publish([Committed("after")])
            await a.heard.heard(Committed("after"))

    arun(go())
