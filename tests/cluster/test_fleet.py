"""The fleet benchmark in its reduced form: 3 real nodes x 1,000 sessions on one
PostgreSQL, a node killed and started again. Correctness only; no figure of time
is asserted (``python -m sessiond.bench.cluster --fleet`` gives those)."""

from __future__ import annotations

import pytest

from sessiond.bench import fleet
from tests.e2e.harness import short_dir

SESSIONS = 1000


@pytest.mark.timeout(420)
def test_a_fleet_places_each_session_once_and_loses_none_when_a_node_dies(pg_dsn: str) -> None:
    got = fleet.run(
        pg_dsn,
        short_dir(),
        count=3,
        sessions=SESSIONS,
        ttl=10.0,  # the default: shorter, a loaded CI machine may lapse a lease (exit 75)
        clients=4,
        send_seconds=1.0,
        settle=0.0,
        say=lambda _: None,
    )
    every = SESSIONS + 1  # and the cron session
    # each listing, without how many looks it took (sessions move meanwhile)
    correct = {
        k: ({f: n for f, n in v.items() if f != "looks"} if isinstance(v, dict) else v)
        for k, v in got["correct"].items()
    }
    # placed: listed once by the fleet (each row from the node that runs it), on a live node
    whole = {"listed": every, "twice": 0, "missing": 0, "not_on_a_live_node": 0}
    assert correct["created"] == whole
    created = got["placement_created"]
    assert sum(p["sessions"] for p in created["per_node"].values()) == every
    assert correct["sessions_in_db"] == every
    # the killed node's sessions: each taken over by a survivor and served there
    fo = got["failover"]
    assert fo["sessions"] > 0
    assert fo["not_taken_over"] == 0
    assert fo["not_on_a_survivor"] == 0
    assert fo["served"] == fo["sessions"]
    assert correct["failed_over"] == whole
    # the node back: still each once, nobody's session lost or doubled
    assert correct["returned"] == whole
    assert correct["unowned_in_db"] == 0
    # cron fired once a fire time across the fleet, a take-over in between
    cron = got["cron"]
    assert cron["distinct"] >= 1
    assert cron["twice"] == 0
    assert cron["missed"] == 0
    assert cron["dedup_keys"] == cron["distinct"]
    assert got["throughput"]["sends_per_s"] > 0
    assert got["ended_by_itself"] == {}
