"""Cron on three nodes: a fire time runs once for the whole cluster."""

from __future__ import annotations

import shutil
import signal
import time
from datetime import datetime, timedelta

import psycopg
import pytest

from sessiond.cluster.once import keys_of
from sessiond.errors import Fenced
from sessiond.log.event_data import LifecycleChanged, MessageReceived, WakeRequested
from sessiond.log.store.base import Draft
from sessiond.log.store.pg.once import AlreadyFired
from sessiond.log.store.pg.pgstore import PgStore
from tests.cluster.conftest import SHARED, TTL, lease, owned, taken_over
from tests.cluster.test_fencing import lapse
from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for
from tests.helpers import arun

PAYROLL = """name = "payroll"
[run]
exec = ["sh", "-c", "echo ran >> ran.txt"]
cwd = "{ws}"

[[trigger]]
type = "cron"
schedule = "0 9 1 * *"
"""


def test_a_missed_cron_fire_runs_once_for_the_cluster_when_all_three_restart(
    three: list[Daemon], pg_dsn: str
) -> None:
    n1 = three[0]
    # a workspace of its own: the node that runs it gives the session's uid an ACL
    # on its workspace, which must not hold another node's socket folder (n1's root)
    ws = short_dir()
    spec = n1.write_spec("payroll", PAYROLL.format(ws=ws))
    n1.ctl("create", str(spec), check=True)
    for d in three:
        d.stop()
    for i, d in enumerate(three, 1):  # 40 days later, every node at once
        d.config.write_text(
            'log_format = "json"\nclock_offset = 3456000\n'
            f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n{i}"\n{lease(False)}{SHARED}'
        )
        d.start(wait=False)
    for d in three:
        d.wait_ready()

    def owners() -> list[Daemon]:
        return [d for d in three if "payroll" in owned(d)]

    (owner,) = wait_for(owners, timeout=30, what="the node that claimed payroll")
    finished = wait_event(owner, "payroll", "run.finished")
    assert finished["data"]["status"] == "ok"
    # the catch-up is decided as the triggers are armed; suspend waits for the lock
    owner.ctl("suspend", "payroll", check=True)
    assert len(owners()) == 1  # no other node runs it (not even blocked)
    wakes = owner.json("log", "payroll", "--type", "wake.requested")
    assert [w["data"]["trigger"] for w in wakes] == ["cron"]
    assert (ws / "ran.txt").read_text() == "ran\n"
    shutil.rmtree(ws, ignore_errors=True)


# --- the dedup key: taken in the same fenced write as the wake ---------------------

FIRE = {"schedule": "0 9 1 * *", "fire": "2026-12-01T09:00:00+00:00"}


def test_a_cron_fire_is_taken_once_in_the_database_in_the_fenced_write_of_its_wake(
    pg_dsn: str,
) -> None:
    # the cluster's rules of what commits once (a daemon's store has them: make_store)
    a = PgStore(pg_dsn, node="a", lease_ttl=60, keys_of=keys_of)
    b = PgStore(pg_dsn, node="b", lease_ttl=60, keys_of=keys_of)

    async def go() -> None:
        old = await a.create("payroll")
        await old.append(LifecycleChanged(to="ready"))
        lapse(pg_dsn, "a")  # a, paused past its lease, fires the time: refused whole
        with pytest.raises(Fenced, match="lease lapsed") as refused:
            await old.append(WakeRequested(trigger="cron", details=FIRE))
        assert not isinstance(refused.value, AlreadyFired)
        assert dedup_keys(pg_dsn) == []  # the key went with the refused write
        await old.close()

        new = await b.open_log("payroll")  # b takes over and fires it: the first time
        list(new.recover())
        await new.append(WakeRequested(trigger="cron", details=FIRE))
        with pytest.raises(AlreadyFired, match="on record already"):  # and never again
            await new.append(WakeRequested(trigger="cron", details=FIRE))
        await new.close()
        again = await b.open_log("payroll")  # nor under a later epoch (a take-over)
        list(again.recover())
        with pytest.raises(AlreadyFired):
            await again.append_many(
                [
                    Draft(MessageReceived(sender="x", text="with it")),
                    Draft(WakeRequested(trigger="cron", details=FIRE)),
                ]
            )
        await again.close()

    try:
        arun(go())
        wakes = [r for r in b.read("payroll") if r["type"] == "wake.requested"]
        assert [(r["node"], r["data"]["details"]["fire"]) for r in wakes] == [("b", FIRE["fire"])]
        assert [r["type"] for r in b.read("payroll")][-1] == "wake.requested"  # nothing after
        assert dedup_keys(pg_dsn) == [f"cron|payroll|{FIRE['schedule']}|{FIRE['fire']}"]
    finally:
        a.close_sync()
        b.close_sync()


def dedup_keys(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT dedup FROM wakes WHERE kind = 'cron' ORDER BY id").fetchall()
    return [r[0] for r in rows]


# --- three nodes, the owner killed right after a fire ------------------------------

SKEW = 20.0  # n2's and n3's clocks run this far behind n1's

EVERY_MINUTE = """name = "tick"
[run]
exec = ["sh", "-c", "echo ran >> ran.txt"]
cwd = "."
side_effect = "read"
idempotency = "safe"

[[trigger]]
type = "cron"
schedule = "* * * * *"
"""


def test_an_owner_killed_right_after_a_fire_and_a_new_owner_behind_it_fire_once(
    pg_dsn: str,
) -> None:
    # n1's clock stands 40 s into a minute: its next fire comes within about 20 s
    ahead = (40 - time.time() % 60) % 60
    nodes: list[Daemon] = []
    try:
        for i, offset, extra in (
            (1, ahead, 'fault = "after-run-finished"\n'),  # dies once the fire's run is on record
            (2, ahead - SKEW, ""),
            (3, ahead - SKEW, ""),
        ):
            config = (
                f"clock_offset = {offset}\n{extra}[cluster]\n"
                f'dsn = "{pg_dsn}"\nnode = "n{i}"\n{lease(i == 1)}{SHARED}'
            )
            nodes.append(Daemon(short_dir(), config).start())
        n1, n2, n3 = nodes
        n1.ctl("create", str(n1.write_spec("tick", EVERY_MINUTE)), check=True)
        fire = datetime.fromisoformat(n1.json("ps")[0]["next_wake"].replace("Z", "+00:00"))

        assert n1.proc is not None
        n1.proc.wait(timeout=120)  # the fault: kill -9 right after the fire's run
        assert n1.stop() == -signal.SIGKILL
        new = wait_for(lambda: taken_over([n2, n3], "tick"), timeout=TTL + 30, what="take-over")
        (row,) = [r for r in new.json("ps") if r["name"] == "tick"]
        # its own clock is behind the fire n1 recorded: the next one is the next minute's
        assert row["next_wake"] is not None
        assert datetime.fromisoformat(row["next_wake"].replace("Z", "+00:00")) == fire + timedelta(
            minutes=1
        )
        records = new.json("log", "tick")
        wakes = [r for r in records if r["type"] == "wake.requested"]
        assert [(w["node"], w["data"]["details"]["fire"]) for w in wakes] == [
            ("n1", fire.isoformat())
        ]
        assert [r["node"] for r in records if r["type"] == "run.finished"] == ["n1"]
        assert (n1.root / "ran.txt").read_text() == "ran\n"
        assert dedup_keys(pg_dsn) == [f"cron|tick|* * * * *|{fire.isoformat()}"]
    finally:
        for d in nodes:
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)
