"""Durable steps through the real daemon (docs/design.md section 8): an SDK program that
runs again for its turn never repeats a step that finished.

The agent (programs/agent.py) counts every piece of real work in a file, because
every run is a new process: ``charge.count`` holds one line per charge made.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for

AGENT = Path(__file__).parent / "programs" / "agent.py"
ROOT = Path(__file__).parents[2]
SPEC = """name = "agent"
goal = "fix f.txt"
[run]
kind = "sdk"
exec = ["{python}", "{agent}"]
cwd = "."
env = {{ PYTHONPATH = "{root}", AGENT_CHARGE = "1"{env} }}
retries = {retries}
[policy]
allow = ["charge_card"]
ask = ["edit_file"]
"""


def make(d: Daemon, env: str = "", retries: int = 0) -> None:
    (d.root / "f.txt").write_text("broken\n")
    text = SPEC.format(python=sys.executable, agent=AGENT, root=ROOT, env=env, retries=retries)
    d.ctl("create", str(d.write_spec("agent", text)), check=True)


def lines(d: Daemon, name: str) -> int:
    path = d.root / f"{name}.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def to(state: str) -> Any:
    return lambda r: r["data"]["to"] == state


def started(d: Daemon, tool: str) -> list[dict[str, Any]]:
    return [
        r for r in d.json("log", "agent", "--type", "tool.started") if r["data"]["tool"] == tool
    ]


def assert_done_once(d: Daemon) -> None:
    """The issue's scenario, finished: each step's work ran exactly once."""
    assert (lines(d, "charge"), lines(d, "model"), lines(d, "edits")) == (1, 1, 1)
    assert lines(d, "read") == 1
    assert len(started(d, "charge_card")) == 1  # the log agrees: one start
    assert len(started(d, "edit_file")) == 1
    assert len(d.json("log", "agent", "--type", "model.responded")) == 1
    assert (d.root / "f.txt").read_text() == "broken\nfixed\n"
    assert d.json("show", "agent")["state"] == "terminated"


@pytest.fixture
def d() -> Iterator[Daemon]:
    """A daemon of the test's own, stopped and removed however the test ends."""
    daemon = Daemon(short_dir()).start()
    try:
        yield daemon
    finally:
        stop(daemon)


def test_a_session_program_cannot_loop_after_complete_when_answered_mid_run(d: Daemon) -> None:
    hold = d.root / "go"
    make(d, env=f', AGENT_HOLD_IN_EDIT = "{hold}"')
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_for(Path(f"{hold}.reached").exists, what="the edit to start")
    hold.write_text("")
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert_done_once(d)
    assert len(d.json("log", "agent", "--type", "run.started")) == 2


def test_a_kill9_after_a_finished_step_continues_the_turn_without_repeating_it(d: Daemon) -> None:
    hold = d.root / "go"
    make(d, env=f', AGENT_HOLD_AFTER_CHARGE = "{hold}"')
    d.ctl("activate", "agent", check=True)
    wait_for(Path(f"{hold}.reached").exists, what="the charge to finish")
    d.kill9()
    hold.write_text("")  # the next run does not wait
    d.start()
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    assert lines(d, "charge") == 1  # replayed after the crash, not charged again
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert_done_once(d)
    # the restart added no wake: the cut-off turn continued once
    assert [r["data"]["trigger"] for r in d.json("log", "agent", "--type", "wake.requested")] == [
        "manual",
        "approval",
    ]


def test_a_kill9_while_an_approval_is_pending_keeps_it_pending(d: Daemon) -> None:
    make(d)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.kill9()
    d.start()
    shown = d.json("show", "agent")
    assert shown["state"] == "blocked"
    assert [a["tool"] for a in shown["pending_approvals"]] == ["edit_file"]
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert_done_once(d)


def test_a_kill9_during_an_unsafe_step_blocks_and_accept_never_reruns_it(d: Daemon) -> None:
    hold = d.root / "go"
    make(d, env=f', AGENT_HOLD_IN_EDIT = "{hold}"')
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_for(Path(f"{hold}.reached").exists, what="the edit to start")
    d.kill9()
    hold.write_text("")
    d.start()
    blocked = wait_event(
        d,
        "agent",
        "lifecycle.changed",
        match=lambda r: (
            to("blocked")(r)
            and "edit_file" in r["data"]["reason"]
            and "pending" not in r["data"]["reason"]
        ),
    )
    assert "edit_file" in blocked["data"]["reason"]
    assert "did not finish" in blocked["data"]["reason"]
    assert lines(d, "edits") == 1
    # The person looked: the edit did not happen. They make it by hand and accept.
    (d.root / "f.txt").write_text("broken\nfixed\n")
    d.ctl("resolve", "agent", "--accept", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "charge"), lines(d, "model"), lines(d, "edits")) == (1, 1, 1)


def test_a_retry_replays_finished_steps_and_never_reruns_a_failed_unsafe_one(d: Daemon) -> None:
    # The first run fails after its charge (the model "crashes"); the retry
    # continues the turn: the charge is replayed, not made again.
    crash = d.root / "crash-once.py"
    crash.write_text(
        "import os, pathlib, runpy\n"
        "if not pathlib.Path('crashed').exists():\n"
        "    import sessiond.sdk as sdk\n"
        "    real = sdk.Run.model_call\n"
        "    def boom(self, *a, **k):\n"
        "        pathlib.Path('crashed').write_text('1')\n"
        "        raise SystemExit(3)\n"
        "    sdk.Run.model_call = boom\n"
        f"runpy.run_path({str(AGENT)!r}, run_name='__main__')\n"
    )
    spec = SPEC.format(python=sys.executable, agent=crash, root=ROOT, env="", retries=2)
    (d.root / "f.txt").write_text("broken\n")
    d.ctl(
        "create",
        str(
            d.write_spec(
                "agent",
                spec.replace(
                    'allow = ["charge_card"]\nask = ["edit_file"]',
                    'allow = ["charge_card", "edit_file"]',
                ),
            )
        ),
        check=True,
    )
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "charge"), lines(d, "model"), lines(d, "edits")) == (1, 1, 1)
    finished = d.json("log", "agent", "--type", "run.finished")
    assert [r["data"]["status"] for r in finished] == ["failed", "ok"]


def test_a_failed_unsafe_step_blocks_the_retry_instead_of_running_again(d: Daemon) -> None:
    prog = d.root / "pay.py"
    prog.write_text(
        "from sessiond.sdk import connect\n"
        "def pay():\n"
        "    open('charge.count', 'a').write('charge\\n')\n"
        "    raise RuntimeError('the card network timed out')\n"
        "with connect() as run:\n"
        "    run.step('charge_card', pay, args={'amount': 42})\n"
        "    run.complete()\n"
    )
    spec = (
        f'name = "agent"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{prog}"]\n'
        f'cwd = "."\nenv = {{ PYTHONPATH = "{ROOT}" }}\nretries = 3\n'
        '[policy]\nallow = ["charge_card"]\n'
    )
    d.ctl("create", str(d.write_spec("agent", spec)), check=True)
    d.ctl("activate", "agent", check=True)
    blocked = wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    assert "charge_card" in blocked["data"]["reason"]
    assert "not idempotent" in blocked["data"]["reason"]
    assert lines(d, "charge") == 1  # no automatic retry ran it again
    d.ctl("resolve", "agent", "--discard", check=True)
    shown = d.json("show", "agent")
    assert shown["state"] == "sleeping"  # the turn ended; nothing was started for it
    assert lines(d, "charge") == 1
    assert len(d.json("log", "agent", "--type", "run.started")) == 1  # no retry started


def test_a_failing_unsafe_command_is_not_retried(d: Daemon) -> None:
    spec = (
        'name = "pay"\n[run]\nexec = ["sh", "-c", "echo paid >> paid.txt; exit 3"]\n'
        'cwd = "."\nretries = 3\nside_effect = "external-write"\nidempotency = "unsafe"\n'
        'resume = "never-rerun"\n'
    )
    d.ctl("create", str(d.write_spec("pay", spec)), check=True)
    d.ctl("activate", "pay", check=True)
    blocked = wait_event(d, "pay", "lifecycle.changed", match=to("blocked"))
    assert "not retried" in blocked["data"]["reason"]
    assert (d.root / "paid.txt").read_text() == "paid\n"


DIVERGE = """from pathlib import Path
from sessiond.sdk import connect
with connect() as run:
    first = Path("plan.txt").read_text().strip()
    run.step(first, lambda: open(first + ".count", "a").write("x\\n"), side_effect="read",
             idempotency="safe", resume="replay-from-event")
    run.step("edit_file", lambda: open("edits.count", "a").write("x\\n"),
             side_effect="workspace-write")
    run.complete()
"""


def diverged(d: Daemon) -> dict[str, Any]:
    prog = d.root / "diverge.py"
    prog.write_text(DIVERGE)
    (d.root / "plan.txt").write_text("look\n")
    spec = (
        f'name = "agent"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{prog}"]\n'
        f'cwd = "."\nenv = {{ PYTHONPATH = "{ROOT}" }}\n[policy]\nask = ["edit_file"]\n'
    )
    d.ctl("create", str(d.write_spec("agent", spec)), check=True)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    (d.root / "plan.txt").write_text("peek\n")  # the next run takes another path
    seq = d.json("show", "agent")["seq"]
    d.ctl("approve", "agent", check=True)
    blocked: dict[str, Any] = wait_event(
        d, "agent", "lifecycle.changed", since=seq + 1, match=to("blocked")
    )
    return blocked


def test_a_divergence_blocks_with_both_steps_and_accept_takes_the_new_path(d: Daemon) -> None:
    blocked = diverged(d)
    reason = blocked["data"]["reason"]
    assert "step 1" in reason
    assert "'peek'" in reason
    assert "'look'" in reason
    assert lines(d, "peek") == 0  # nothing ran
    refused = d.ctl("resolve", "agent", "--rerun")  # not an option for a divergence
    assert refused.returncode == 1
    assert "--accept" in refused.stderr
    seq = d.json("show", "agent")["seq"]
    d.ctl("resolve", "agent", "--accept", check=True)
    # edit asks again: a block after the resolve (the divergence's own came before)
    wait_event(d, "agent", "lifecycle.changed", since=seq + 1, match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "look"), lines(d, "peek"), lines(d, "edits")) == (1, 1, 1)


def test_a_divergence_discarded_ends_the_turn_and_runs_nothing(d: Daemon) -> None:
    diverged(d)
    d.ctl("resolve", "agent", "--discard", check=True)
    shown = d.json("show", "agent")
    assert shown["state"] == "sleeping"
    assert (lines(d, "look"), lines(d, "peek"), lines(d, "edits")) == (1, 0, 0)
    assert len(d.json("log", "agent", "--type", "run.started")) == 2


def stop(d: Daemon) -> None:
    try:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
    finally:
        shutil.rmtree(d.root, ignore_errors=True)
