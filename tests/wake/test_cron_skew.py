"""Armed on a clock behind the fire on record (a cluster's take-over by a node
whose clock is behind the old owner's): the next fire is after that one, never
that one again; and a schedule repeated in one spec arms once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sessiond.log.event_data import SessionCreated, WakeRequested
from sessiond.log.journal import Journal
from sessiond.log.store.memory import MemoryStore
from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec
from sessiond.wake.triggers import Triggers

FIRE = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
CRON = '[[trigger]]\ntype = "cron"\nschedule = "0 9 * * *"\n'


class Host:
    def __init__(self, store: MemoryStore, s: Session) -> None:
        self.store = store
        self.table = [s]
        self.wakes: list[dict[str, Any]] = []

    def spawn(self, coro: Any) -> None:
        coro.close()

    def wake(self, s: Session, trigger: str, details: dict[str, Any], paths: Any = None) -> Any:
        self.wakes.append(details)

        async def nothing() -> None:
            return None

        return nothing()


def armed_behind(triggers_toml: str, behind: float) -> tuple[dict[str, datetime], Host]:
    async def go() -> tuple[dict[str, datetime], Host]:
        store = MemoryStore(clock=lambda: int((FIRE - timedelta(days=1)).timestamp() * 1e9))
        log = await store.create("w")
        await log.append(SessionCreated(name="w"))
        await log.append(WakeRequested(trigger="cron", details={"fire": FIRE.isoformat()}))
        await log.close()
        journal = await Journal.open(store, "w")
        spec = parse_spec(f'name = "w"\n[run]\nexec = ["true"]\n{triggers_toml}', base=Path("/"))
        s = Session("w", journal, spec)
        host = Host(store, s)
        now = (FIRE - timedelta(seconds=behind)).timestamp()
        triggers = Triggers(host, clock=lambda: now, poll_step_ms=15)  # type: ignore[arg-type]
        triggers.arm(s)
        fires = dict(triggers.armed["w"].next_fires)
        triggers.armed.pop("w").cancel()
        await journal.close()
        return fires, host

    return asyncio.run(go())


def test_a_clock_behind_the_recorded_fire_arms_the_next_one() -> None:
    fires, host = armed_behind(CRON, behind=20)
    assert fires == {"cron#0": FIRE + timedelta(days=1)}
    assert host.wakes == []  # and no catch-up either


def test_a_schedule_repeated_in_one_spec_arms_once() -> None:
    fires, _ = armed_behind(CRON + CRON + CRON.replace("0 9", "30 9"), behind=20)
    assert fires == {"cron#0": FIRE + timedelta(days=1), "cron#2": FIRE + timedelta(minutes=30)}
