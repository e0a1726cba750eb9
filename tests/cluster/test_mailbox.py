"""``send`` across nodes (cluster/mailbox.py): NOTIFY is the hint, the table the
truth. A message whose notification is lost still arrives (the poll); one too
long for a notification's payload arrives whole; a message a poll and its
notification both bring is delivered once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import psycopg
import pytest

from sessiond.cluster.mailbox import Mailbox
from sessiond.cluster.pg import mail
from sessiond.cluster.pg.channels import PgBroker
from sessiond.cluster.pg.mail import PgMail
from sessiond.log.store.pg.pgstore import PgStore
from tests.cluster.conftest import HELLO, nodes_of
from tests.e2e.harness import Daemon, wait_event


@pytest.fixture
def two(pg_dsn: str) -> Iterator[list[Daemon]]:
    with nodes_of(pg_dsn, 2, extra="") as made:
        yield made


def _texts(d: Daemon, session: str) -> list[str]:
    return [r["data"]["text"] for r in d.json("log", session, "--type", "message.received")]


def test_a_message_whose_notification_is_lost_arrives_by_the_poll(
    two: list[Daemon], pg_dsn: str
) -> None:
    owner, _ = two
    owner.ctl("create", str(owner.write_spec("hello", HELLO)), check=True)
    # a row nobody NOTIFYed about: what a node sees of a notification sent while
    # its listener was reconnecting
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO messages (session, sender, body) VALUES ('hello', 'n2', 'unannounced')"
        )
    received = wait_event(owner, "hello", "message.received")
    assert (received["data"]["sender"], received["data"]["text"]) == ("n2", "unannounced")
    wait_event(owner, "hello", "run.finished")  # and it woke the session
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT taken_at IS NOT NULL FROM messages").fetchall() == [(True,)]


def test_a_message_too_long_for_a_notification_crosses_nodes_whole_and_once(
    two: list[Daemon],
) -> None:
    owner, other = two
    owner.ctl("create", str(owner.write_spec("hello", HELLO)), check=True)
    long = "".join(f'line {i}: ü "quoted" \\ tab\t\n' for i in range(600))
    assert len(long.encode()) > mail.PAYLOAD_MAX
    sent = other.json("send", "hello", long)
    assert sent["node"] == "n1"
    wait_event(owner, "hello", "message.received", match=lambda r: r["data"]["text"] == long)
    # one more after it, through the payload: once it is in, the first has had its
    # chances to come twice (a node delivers in order)
    other.ctl("send", "hello", "short", check=True)
    wait_event(owner, "hello", "message.received", match=lambda r: r["data"]["text"] == "short")
    assert _texts(owner, "hello") == [long, "short"]


def test_a_message_a_poll_and_its_notification_both_bring_is_delivered_once(
    pg_dsn: str,
) -> None:
    """The owner's side, with the daemon's wake replaced by a list: the poll takes
    the message first, then its notification comes."""
    delivered: list[tuple[str, str, str]] = []
    takes: list[str | None] = []

    async def local(
        to: str, text: str, sender: str = "sessionctl", message_id: str | None = None
    ) -> dict[str, Any]:
        # the daemon's send commits message.received, which takes the row it
        # names in the same transaction (pg/once.py): here, the name is recorded
        delivered.append((to, text, sender))
        takes.append(message_id)
        return {}

    async def run() -> list[tuple[Any, ...]]:
        store = PgStore(pg_dsn, node="n2", lease_ttl=60)
        try:
            log = await store.create("w")
            await log.close()
            pool = await store.connect()
            node = SimpleNamespace(table=SimpleNamespace(sessions={"w": None}))
            box = Mailbox(store, PgMail(store), PgBroker(pg_dsn))  # its broker not started
            box.deliver_to(cast(Any, node.table), cast(Any, local))
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
                await conn.execute(f"LISTEN {mail.CHANNEL}")
                posted = await mail.post(pool, "w", "n1", "once")
                assert posted is not None
                await box._poll()  # the backstop, before the notification is read
                notes = [n async for n in conn.notifies(timeout=30, stop_after=1)]
            got = mail.parse(notes[0].payload)
            assert isinstance(got, mail.Message)
            await box._one(got)  # the notification, afterwards
            await box._poll()
            async with pool.connection() as c:
                cur = await c.execute("SELECT id, body FROM messages")
                return await cur.fetchall()
        finally:
            await store.aclose()

    rows = asyncio.run(run())
    assert delivered == [("w", "once", "n1")]
    assert [body for _, body in rows] == ["once"]
    assert takes == [f"cluster:{rows[0][0]}"]  # the row its commit takes
