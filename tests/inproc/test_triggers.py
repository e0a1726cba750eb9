"""Triggers in process, on the manual clock: cron and every fire when the test moves
the clock, limits and cool-downs (moved from tests/e2e/test_triggers.py; the
file-system watch, [bind], git and the wake storm stay there)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from sessiond.codec import EventRecord
from tests.inproc.fakes import FakeRun
from tests.inproc.harness import Harness

DAY = 86_400.0


def recording(h: Harness, name: str = "record") -> list[dict[str, Any]]:
    """``cat "$SESSIOND_WAKE_FILE" >> wakes.jsonl``: every run's wakes, as it read them."""
    seen: list[dict[str, Any]] = []

    @h.program(name)
    async def record(run: FakeRun) -> int:
        seen.append(orjson.loads(Path(run.env["SESSIOND_WAKE_FILE"]).read_bytes()))
        return 0

    return seen


def run_is(run: str) -> Callable[[EventRecord], bool]:
    return lambda r: bool(r["data"]["run"] == run)


async def test_a_missed_cron_fire_runs_once_after_a_restart(tmp_path: Path) -> None:
    spec = (
        'name = "payroll"\n[run]\nexec = ["true", "record"]\ncwd = "."\n'
        '[[trigger]]\ntype = "cron"\nschedule = "0 9 1 * *"\n'
    )
    async with Harness(tmp_path) as h:
        await h.create(spec, "payroll")
        assert "Z" in (await h.call("ps"))[0]["next_wake"]  # the next 09:00 on the 1st
        store, clock = h.store, h.clock
    clock.advance(40 * DAY)  # the daemon was down for 40 days
    async with Harness(tmp_path, store=store) as h:
        seen = recording(h)
        finished = await h.event("payroll", "run.finished")
        assert finished["data"]["status"] == "ok"
        wake = (await h.log("payroll", types=["wake.requested"]))[-1]["data"]
        assert (wake["trigger"], wake["details"]["catch_up"]) == ("cron", True)
        await h.idle()
        assert len(seen) == 1  # once, however many fires were missed
    async with Harness(tmp_path, store=store) as h:  # the same clock again
        seen = recording(h)
        # the catch-up covered everything up to it: nothing is due
        await h.call("suspend", name="payroll")
        await h.idle()
        assert seen == []
        assert len(await h.log("payroll", types=["wake.requested"])) == 1


async def test_a_cron_fires_when_its_time_comes_and_not_before(h: Harness) -> None:
    seen = recording(h)
    spec = (
        'name = "daily"\n[run]\nexec = ["true", "record"]\ncwd = "."\n'
        '[[trigger]]\ntype = "cron"\nschedule = "0 9 * * *"\n'
    )
    await h.create(spec, "daily")
    await h.advance(DAY - 120)  # not yet a day: one fire of 09:00 is due at most ...
    fired = len(seen)
    assert fired <= 1
    await h.advance(DAY)  # ... a day later, exactly one more
    await h.event("daily", "run.finished", after=0)
    await h.idle()
    assert len(seen) == fired + 1
    wakes = await h.log("daily", types=["wake.requested"])
    assert [w["data"]["trigger"] for w in wakes] == ["cron"] * len(seen)


async def test_an_every_interval_runs_again_after_the_interval_from_the_last_end(
    h: Harness,
) -> None:
    seen = recording(h)
    spec = (
        'name = "tick"\n[run]\nexec = ["true", "record"]\ncwd = "."\n'
        '[[trigger]]\ntype = "every"\ninterval = "1h"\n'
    )
    await h.create(spec, "tick")
    await h.idle()
    assert seen == []  # not before the interval
    await h.advance(3600)
    await h.event("tick", "run.finished")
    await h.idle()
    assert len(seen) == 1
    assert seen[0]["wakes"][0]["trigger"] == "every"
    await h.advance(1800)
    assert len(seen) == 1  # half an interval after the run: not yet
    await h.advance(1800)
    await h.event("tick", "run.finished", lambda r: r["data"]["run"] == "r2")
    await h.idle()
    assert len(seen) == 2


async def test_a_concurrency_limit_queues_and_then_runs_the_next(tmp_path: Path) -> None:
    async with Harness(tmp_path, "max_running = 1\n") as h:
        order: list[str] = []
        go = asyncio.Event()

        @h.program("ordered")
        async def ordered(run: FakeRun) -> int:
            await go.wait()
            order.append(run.session)
            return 0

        for name in ("first", "second"):
            spec = (
                f'name = "{name}"\n[run]\nexec = ["true", "ordered"]\n'
                'cwd = "."\n[[trigger]]\ntype = "message"\n'
            )
            await h.create(spec, name)
        await h.call("activate", name="first")
        queued = await h.call("activate", name="second")
        assert queued["state"] == "ready"
        assert queued["reason"].startswith("queued: 1 of 1 slots busy")
        go.set()
        await h.event("second", "run.finished")
        assert order == ["first", "second"]


async def test_a_wake_burst_over_the_limit_cools_down_visibly_then_runs_once(h: Harness) -> None:
    runs = recording(h)
    spec = (
        'name = "r"\n[run]\nexec = ["true", "record"]\ncwd = "."\n'
        '[limits]\nburst = 2\ninterval = "10s"\ncool_down = "1s"\n'
        '[[trigger]]\ntype = "message"\n'
    )
    await h.create(spec, "r")
    for i in range(2):
        await h.call("send", to="r", text=f"m{i}")
        await h.event("r", "run.finished", run_is(f"r{i + 1}"))
        await h.idle()
    for i in range(2, 6):
        await h.call("send", to="r", text=f"m{i}")
    await h.idle()
    cooling = await h.call("show", name="r")
    assert cooling["state"] == "sleeping"
    assert cooling["reason"].startswith("rate limit: more than 2 wakes in 10s")
    assert cooling["until"] is not None
    assert len(runs) == 2
    await h.advance(1)  # the cool-down's second
    over = await h.event(
        "r", "lifecycle.changed", lambda r: r["data"]["reason"] == "cool-down over"
    )
    await h.event("r", "run.finished", after=over["seq"])
    await h.idle()
    assert len(runs) == 3  # once, for the four wakes that came meanwhile
    assert [w["details"]["text"] for w in runs[2]["wakes"]] == ["m2", "m3", "m4", "m5"]


async def test_bad_trigger_settings_are_refused_naming_the_key(h: Harness) -> None:
    cases = {
        "cron": ('[[trigger]]\ntype = "cron"\nschedule = "99 * * * *"\n', "trigger[0]"),
        "tz": (
            '[[trigger]]\ntype = "cron"\nschedule = "0 9 * * *"\ntimezone = "Mars/Olympus"\n',
            "Mars/Olympus",
        ),
        "escape": (
            '[[trigger]]\ntype = "watch"\npaths = ["../../etc/*"]\n', "inside the workspace"
        ),
        "norepo": ('[[trigger]]\ntype = "git"\nrepo = "."\n', "trigger[0].repo"),
    }  # fmt: skip
    for name, (trigger, message) in cases.items():
        spec = f'name = "{name}"\n[run]\nexec = ["true"]\ncwd = "."\n{trigger}'
        refused = await h.refused("create", spec=spec, base=str(h.root))
        assert refused.exit_code == 5, name
        assert message in str(refused), (name, str(refused))
    assert await h.call("ps") == []
