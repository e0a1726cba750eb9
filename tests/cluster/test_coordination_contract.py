"""The contract of the cluster's coordination (sessiond.cluster.coordination), run
against each implementation (today PostgreSQL, on a real server), as the store's
contract is (tests/log/test_store_contract.py).

Each implementation comes with the store it coordinates (the pair a node uses):
the store makes the sessions and fences their logs; coordination moves them
between nodes. A test speaks to coordination through the interface only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessiond.cluster.coordination import Coordination
from sessiond.cluster.once import keys_of
from sessiond.cluster.pg.coordination import PgCoordination
from sessiond.cluster.placement import placement_for
from sessiond.errors import Fenced
from sessiond.log.event_data import MessageReceived
from sessiond.log.store.base import Store
from sessiond.log.store.pg.pgstore import PgStore
from sessiond.log.store.pg.placement import Placement
from sessiond.table.spec import parse_spec, spec_to_toml
from tests.cluster.test_fencing import lapse
from tests.helpers import arun

SHARED = [Path("/srv/shared")]  # the workspaces below are outside it unless said


@dataclass
class Member:
    """One node: its store and its coordination."""

    store: Store
    coord: Coordination


# (where, how to make a member there): a database's DSN and a node's name
Backend = tuple[str, Callable[..., AbstractAsyncContextManager[Member]]]


@asynccontextmanager
async def pg_member(
    dsn: str, name: str, labels: dict[str, str] | None = None
) -> AsyncIterator[Member]:
    store = PgStore(
        dsn,
        node=name,
        lease_ttl=60,
        labels=labels,
        placement_for=placement_for(name, SHARED),
        keys_of=keys_of,
    )
    await store.connect()  # registers the node (a new incarnation)
    coord = PgCoordination(store)
    coord.publish(0, 0, 1)  # it takes part: sessions are dealt to it (as a node's take-over)
    try:
        yield Member(store, coord)
    finally:
        await store.aclose()


@pytest.fixture(params=["postgresql"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """(where, how to make a member there) for each implementation."""
    if request.param == "postgresql":
        return request.getfixturevalue("pg_dsn"), pg_member
    raise AssertionError(request.param)


def spec(text: str, base: str = "/home/ann/work") -> str:
    """A spec as a node stores it (paths resolved from its folder)."""
    return spec_to_toml(parse_spec(text, base=Path(base)))


async def made(m: Member, name: str, text: str | None = None) -> None:
    log = await m.store.create(name, spec=text)
    await log.close()


def test_every_node_is_listed_and_each_knows_itself(backend: Backend) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a", {"zone": "eu"}) as a, member(where, "b") as b:
            await made(a, "s1")
            listed = {n["name"]: n for n in a.coord.nodes()}
            assert set(listed) == {"a", "b"}
            assert listed["a"]["self"]
            assert not listed["b"]["self"]
            assert listed["a"]["state"] == "up"
            assert listed["a"]["alive"]
            assert listed["a"]["labels"] == {"zone": "eu"}
            assert listed["a"]["sessions"] == 1
            assert b.coord.node_row("a") == (True, "up", {"zone": "eu"})
            assert b.coord.node_row("nobody") is None

    arun(go())


def test_a_drained_node_takes_nothing_handed_over(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await made(a, "s1")
            assert a.coord.target_for("s1", None) == "b"
            assert a.coord.drain("b") == 0
            assert b.coord.node_row("b") == (True, "draining", {})
            assert a.coord.target_for("s1", None) is None  # draining: no target
            assert a.coord.hand_over("s1", None) is None
            assert a.coord.drain("nobody") is None

    arun(go())


def test_a_hand_over_moves_the_session_and_fences_its_old_owner(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            log = await a.store.create("s1")
            assert "s1" not in b.coord.orphans()  # a's, alive: not b's to take
            assert a.coord.hand_over("s1", "b") == "b"
            assert a.store.owner_of("s1") == "b"
            assert "s1" in b.coord.orphans()  # handed to it: b takes it
            with pytest.raises(Fenced):  # the epoch went up: nothing of a's lands
                await log.append(MessageReceived(sender="x", text="late"))
            await log.close()
            assert a.coord.hand_over("s1", None) is None  # not a's any more

    arun(go())


def test_a_session_goes_only_where_its_spec_lets_it(
    backend: Backend,
) -> None:
    where, member = backend
    pinned = spec('name = "p"\nnode = "c"\n')
    gpu = spec('name = "g"\nnode_labels = { gpu = "yes" }\n')

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await made(a, "p", pinned)
            await made(a, "g", gpu)
            assert a.coord.misplaced() == ["g", "p"]  # made here, may not run here
            assert a.coord.movable() == ["g", "p"]
            assert a.coord.homed_on("c") == 1
            assert a.coord.target_for("p", None) is None  # c is not up
            assert a.coord.hand_over("p", "b") is None  # nor may b run it
            placed, owner, alive = a.coord.placement("p") or (None, None, None)
            assert placed == Placement("c", {}, None, None)
            assert (owner, alive) == ("a", True)
            assert a.coord.placement("nobody") is None
            async with member(where, "c", {"gpu": "yes"}) as c:
                assert a.coord.target_for("p", None) == "c"
                assert a.coord.target_for("g", "b") is None
                assert a.coord.hand_over("g", None) == "c"
                assert c.coord.misplaced() == []
            assert b.coord.movable() == []

    arun(go())


def test_a_released_session_waits_and_says_for_what(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a:
            await made(a, "p", spec('name = "p"\nnode = "c"\n'))
            await made(a, "here")
            assert a.coord.waiting() == []
            assert a.coord.release("p")
            assert not a.coord.release("p")  # nobody's now, not a's
            assert a.store.owner_of("p") is None
            assert a.coord.waiting() == [
                {"name": "p", "node": "c", "reason": "waiting for node c (its spec pins it there)"}
            ]
            assert "p" not in a.coord.orphans()  # it may not run on a

    arun(go())


def test_a_dead_nodes_sessions_are_offered_where_they_fit_and_a_workspace_can_be_rehomed(
    backend: Backend,
) -> None:
    where, member = backend
    workspace = spec('name = "w"\n[run]\nexec = ["true"]\n')  # in /home/ann/work, on a

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b:
            await made(a, "x")
            await made(a, "w", workspace)
            placed = a.coord.placement("w")
            assert placed is not None
            assert placed[0].workspace_node == "a"
            assert not b.coord.rehome("w", "b")  # its node is up: not for --force
            lapse(where, "a")
            assert b.coord.orphans() == ["x"]  # w's workspace is on a
            assert b.coord.waiting()[0]["name"] == "w"
            assert b.coord.rehome("w", "b")
            assert b.coord.orphans() == ["w", "x"]

    arun(go())


def test_a_dead_nodes_sessions_are_dealt_to_the_least_loaded_and_each_node_says_its_load(
    backend: Backend,
) -> None:
    where, member = backend

    async def go() -> None:
        async with member(where, "a") as a, member(where, "b") as b, member(where, "c") as c:
            for i in range(6):
                await made(a, f"s{i}")
            await made(c, "mine")
            b.coord.publish(1, 2, 4)
            listed = {n["name"]: n for n in b.coord.nodes()}
            assert (listed["b"]["running"], listed["b"]["ready"]) == (1, 2)
            assert listed["b"]["max_running"] == 4
            assert listed["a"]["share"] == listed["b"]["share"] == round(7 / 3, 2)
            lapse(where, "a")
            # dealt by sessions, each tie to the less busy: b (none yet) first, then
            # c (one already), then every tie to c, whose programs are less busy
            taken = b.coord.orphans()
            assert taken == ["s0", "s2", "s4"]
            assert sorted(taken + c.coord.orphans()) == sorted(
                ["mine", *(f"s{i}" for i in range(6))]
            )
            listed = {n["name"]: n for n in c.coord.nodes()}
            assert (listed["b"]["sessions"], listed["c"]["sessions"]) == (3, 4)
            assert listed["a"]["share"] == 0.0  # its lease lapsed: no share
            assert listed["b"]["share"] == 3.5

    arun(go())
