"""Scheduling under pressure: queues, limits, shutdown and restarts keep their
promises (moved in process from tests/e2e/test_scheduling.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.inproc.fakes import FakeRun
from tests.inproc.harness import Harness


def spec(name: str, program: str = "", extra: str = "") -> str:
    return f'name = "{name}"\n[run]\nexec = ["true", "{program or name}"]\ncwd = "."\n{extra}'


def writes(h: Harness, name: str, text: str) -> None:
    """``echo TEXT >> NAME.txt``"""

    @h.program(name)
    async def write(_run: FakeRun) -> int:
        with (h.root / f"{name}.txt").open("a") as f:
            f.write(text + "\n")
        return 0


async def test_a_cancelled_queued_session_does_not_stall_the_queue(tmp_path: Path) -> None:
    async with Harness(tmp_path, "max_running = 1\n") as h:
        go = asyncio.Event()  # a holds the only slot until the test says so

        @h.program("a")
        async def hold(_run: FakeRun) -> int:
            await go.wait()
            return 0

        writes(h, "b", "b")
        writes(h, "c", "c")
        for name in ("a", "b", "c"):
            await h.create(spec(name), name)
        await h.call("activate", name="a")
        await h.event("a", "run.started")
        for name in ("b", "c"):
            await h.call("activate", name=name)
            assert (await h.call("show", name=name))["state"] == "ready"
        await h.call("cancel", name="b")
        cancelled = await h.call("show", name="b")
        assert (cancelled["state"], cancelled["outcome"]) == ("terminated", "cancelled")
        go.set()
        await h.event("c", "run.finished")
        await h.idle()
        assert (tmp_path / "c.txt").read_text() == "c\n"
        assert not (tmp_path / "b.txt").exists()  # b never ran
        b_log = await h.log("b")
        assert "run.started" not in [r["type"] for r in b_log]
        assert b_log[-1]["data"]["to"] == "terminated"  # and nothing after it


async def test_simultaneous_wakes_never_exceed_the_limit(tmp_path: Path) -> None:
    async with Harness(tmp_path, "max_running = 1\n") as h:
        lines: list[str] = []

        @h.program("work")
        async def work(_run: FakeRun) -> int:
            lines.append("start")
            for _ in range(20):  # give every other start its chance to overlap
                await asyncio.sleep(0)
            lines.append("end")
            return 0

        names = [f"s{i}" for i in range(6)]
        for name in names:
            await h.create(spec(name, "work"), name)
        await asyncio.gather(*(h.call("activate", name=n) for n in names))
        for name in names:
            await h.event(name, "run.finished")
        await h.idle()
        assert lines == ["start", "end"] * 6  # one at a time, never overlapping


async def test_shutdown_starts_nothing_new_and_the_restart_runs_the_pending_wake(
    tmp_path: Path,
) -> None:
    runs: list[str] = []

    async def forever(run: FakeRun) -> int:
        runs.append(run.run_id)
        await asyncio.Event().wait()
        return 0

    async with Harness(tmp_path) as h:
        h.program("s")(forever)
        await h.create(spec("s", extra='[[trigger]]\ntype = "message"\n'), "s")
        await h.call("send", to="s", text="one")
        await h.event("s", "run.started")
        await h.call("send", to="s", text="two")  # pending while it runs
        store = h.store
    assert runs == ["r1"]  # no follow-up during shutdown
    async with Harness(tmp_path, store=store) as again:
        again.program("s")(forever)
        second = await again.event("s", "run.started", lambda r: r["data"]["run"] == "r2")
        assert second["data"]["run"] == "r2"  # the pending wake runs after the restart


async def test_a_retry_pending_at_a_restart_still_happens(tmp_path: Path) -> None:
    runs: list[str] = []

    async def fail(run: FakeRun) -> int:
        runs.append(run.run_id)
        return 1

    async with Harness(tmp_path) as h:
        h.program("f")(fail)
        await h.create(spec("f", extra="retries = 1\n"), "f")
        await h.call("activate", name="f")
        await h.event("f", "lifecycle.changed", lambda r: "retry 1 of" in r["data"]["reason"])
        store = h.store
    async with Harness(tmp_path, store=store) as again:
        again.program("f")(fail)
        second = await again.event("f", "run.finished", lambda r: r["data"]["run"] == "r2")
        assert second["data"]["status"] == "failed"
        assert runs == ["r1", "r2"]  # the first run and its one retry
        await again.idle()


async def test_a_program_that_cannot_start_frees_its_slot_for_the_queue(tmp_path: Path) -> None:
    async with Harness(tmp_path, "max_running = 1\n") as h:
        writes(h, "c", "c")
        await h.create(spec("a"), "a")
        bad = 'name = "bad"\n[run]\nexec = ["./no-such-program"]\ncwd = "."\n'
        await h.create(bad, "bad")
        await h.create(spec("c"), "c")
        for name in ("a", "bad", "c"):
            await h.call("activate", name=name)
        failed = await h.event("bad", "run.finished")
        assert failed["data"]["status"] == "failed"
        assert "no-such-program" in failed["data"]["error"]
        await h.event("c", "run.finished")  # the failed start handed its slot on
        await h.idle()
        assert (tmp_path / "c.txt").read_text() == "c\n"


async def test_failed_runs_retry_with_backoff_then_block(h: Harness) -> None:
    """(Moved from tests/e2e/test_sdk.py; the backoff is skipped by moving the clock.)"""
    tries: list[str] = []

    @h.program("flaky")
    async def flaky(run: FakeRun) -> int:
        tries.append(run.run_id)
        return 3

    await h.create(spec("flaky", extra="retries = 2\n"), "flaky")
    await h.call("activate", name="flaky")
    await h.settle(lambda: h.session("flaky").state == "blocked")
    blocked = (await h.log("flaky", types=["lifecycle.changed"]))[-1]
    assert "run failed 3 times in a row" in blocked["data"]["reason"]
    assert len(tries) == 3  # the first run and 2 retries
    reasons = [r["data"]["reason"] for r in await h.log("flaky", types=["lifecycle.changed"])]
    assert any("retry 1 of 2 in 1s" in r for r in reasons)
    assert any("retry 2 of 2 in 2s" in r for r in reasons)


async def test_a_spent_daily_budget_suspends_with_the_reason(h: Harness) -> None:
    """(Moved from tests/e2e/test_sdk.py.)"""
    text = (
        'name = "b"\n[run]\nexec = ["true"]\n[budget]\nruns_per_day = 1\n'
        '[[trigger]]\ntype = "message"\n'
    )
    await h.create(text, "b")
    await h.call("activate", name="b")
    await h.event("b", "run.finished")
    await h.idle()
    await h.call("send", to="b", text="again")
    suspended = await h.event("b", "lifecycle.changed", lambda r: r["data"]["to"] == "suspended")
    assert suspended["data"]["reason"].startswith("budget: runs_per_day: 1 of 1 used today")
    exhausted = (await h.log("b", types=["budget.exhausted"]))[0]["data"]
    assert (exhausted["budget"], exhausted["limit"], exhausted["used"]) == ("runs_per_day", 1, 1)
