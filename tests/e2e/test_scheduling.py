"""Scheduling under pressure: queues, limits, shutdown and restarts keep their promises."""

from __future__ import annotations

import shutil
import threading

from tests.e2e.harness import Daemon, running, short_dir, wait_event


def make(d: Daemon, name: str, cmd: str, extra: str = "") -> None:
    spec = f'name = "{name}"\n[run]\nexec = ["sh", "-c", "{cmd}"]\ncwd = "."\n{extra}'
    d.ctl("create", str(d.write_spec(name, spec)), check=True)


def test_a_cancelled_queued_session_does_not_stall_the_queue() -> None:
    with running("max_running = 1\n") as d:
        # a holds the only slot until the test says so: b and c are provably queued
        make(d, "a", "while [ ! -e go ]; do sleep 0.05; done")
        make(d, "b", "echo b > b.txt")
        make(d, "c", "echo c > c.txt")
        d.ctl("activate", "a", check=True)
        wait_event(d, "a", "run.started")
        for name in ("b", "c"):
            d.ctl("activate", name, check=True)
            assert d.json("show", name)["state"] == "ready"
        d.ctl("cancel", "b", check=True)
        cancelled = d.json("show", "b")
        assert (cancelled["state"], cancelled["outcome"]) == ("terminated", "cancelled")
        (d.root / "go").touch()
        wait_event(d, "c", "run.finished")
        assert (d.root / "c.txt").read_text() == "c\n"
        assert not (d.root / "b.txt").exists()  # b never ran
        b_log = d.json("log", "b")
        assert "run.started" not in [r["type"] for r in b_log]
        assert b_log[-1]["data"]["to"] == "terminated"  # and nothing after it


def test_simultaneous_wakes_never_exceed_the_limit() -> None:
    with running("max_running = 1\n") as d:
        names = [f"s{i}" for i in range(6)]
        for name in names:
            make(d, name, "echo start >> log.txt; sleep 0.3; echo end >> log.txt")
        threads = [threading.Thread(target=d.ctl, args=("activate", n)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name in names:
            wait_event(d, name, "run.finished", timeout=60)
        lines = (d.root / "log.txt").read_text().split()
        assert lines == ["start", "end"] * 6  # one at a time, never overlapping


def test_shutdown_starts_nothing_new_and_the_restart_runs_the_pending_wake() -> None:
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        make(d, "s", "echo start >> runs.txt; sleep 20", '[[trigger]]\ntype = "message"\n')
        d.ctl("send", "s", "one", check=True)
        wait_event(d, "s", "run.started")
        d.ctl("send", "s", "two", check=True)  # pending while it runs
        assert d.stop() == 0
        assert (root / "runs.txt").read_text() == "start\n"  # no follow-up during shutdown
        d.start()
        second = wait_event(
            d, "s", "run.started", since=5, match=lambda r: r["data"]["run"] == "r2"
        )
        assert second["data"]["run"] == "r2"  # the pending wake runs after the restart
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_retry_pending_at_a_restart_still_happens() -> None:
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        spec = (
            'name = "f"\n[run]\nexec = ["sh", "-c", "echo x >> runs.txt; exit 1"]\n'
            'cwd = "."\nretries = 1\n'
        )
        d.ctl("create", str(d.write_spec("f", spec)), check=True)
        d.ctl("activate", "f", check=True)
        wait_event(d, "f", "lifecycle.changed", match=lambda r: "retry 1 of" in r["data"]["reason"])
        d.stop()
        d.start()
        second = wait_event(
            d, "f", "run.finished", match=lambda r: r["data"]["run"] == "r2", timeout=30
        )
        assert second["data"]["status"] == "failed"
        assert (root / "runs.txt").read_text() == "x\nx\n"  # the first run and its one retry
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_program_that_cannot_start_frees_its_slot_for_the_queue() -> None:
    with running("max_running = 1\n") as d:
        make(d, "a", "sleep 0.5")
        bad = 'name = "bad"\n[run]\nexec = ["./no-such-program"]\ncwd = "."\n'
        d.ctl("create", str(d.write_spec("bad", bad)), check=True)
        make(d, "c", "echo c > c.txt")
        for name in ("a", "bad", "c"):
            d.ctl("activate", name, check=True)
        failed = wait_event(d, "bad", "run.finished")
        assert failed["data"]["status"] == "failed"
        assert "no-such-program" in failed["data"]["error"]
        wait_event(d, "c", "run.finished")  # the failed start handed its slot on
        assert (d.root / "c.txt").read_text() == "c\n"
