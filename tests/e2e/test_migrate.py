"""``migrate --to``: the two-phase hand-over between two real daemons.

Each side is killed (-9) at each phase through the daemon's named fault points
(``fault = "migrate-…"`` at the source, ``"arrive-…"`` at the target), both are
started again, and exactly one live copy must be left: a copy is live unless it
is ``arriving`` or ``terminated``, or not there at all.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for

MOVER = """name = "mover"
goal = "{goal}"
[run]
exec = ["sh", "-c", "echo moved"]
cwd = "."
[[trigger]]
type = "message"
"""

PLAIN = 'log_format = "json"\nstop_grace = "2s"\nshutdown_grace = "3s"\n'


@contextmanager
def pair(source_fault: str = "", target_fault: str = "") -> Iterator[tuple[Daemon, Daemon]]:
    """A source with session ``mover`` (sleeping: armed by its message trigger) and
    a target; each dies at its named fault point, if one is given."""
    roots = [short_dir(), short_dir()]
    try:
        source = Daemon(roots[0], f'fault = "{source_fault}"\n' if source_fault else "")
        target = Daemon(roots[1], f'fault = "{target_fault}"\n' if target_fault else "")
        source.start()
        target.start()
        spec = source.write_spec("mover", MOVER.format(goal="move me"))
        source.ctl("create", str(spec), check=True)
        yield source, target
    finally:
        for d in (source, target):
            if d.proc is not None:  # a dead one too: its log pipe is closed
                d.stop()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


def restart(d: Daemon) -> None:
    """Start ``d`` again after its fault killed it, without the fault."""
    assert d.proc is not None
    assert d.proc.wait(30) == -9  # it died at its fault point, as a crash
    d.config.write_text(PLAIN)
    d.start()


def state_of(d: Daemon, name: str = "mover") -> str | None:
    done = d.ctl("--json", "show", name)
    if done.returncode == 4:
        return None
    assert done.returncode == 0, done.stderr
    state: str = orjson.loads(done.stdout)["state"]
    return state


def live(*daemons: Daemon) -> list[Path]:
    """The daemons (by root) where ``mover`` is live."""
    return [d.root for d in daemons if state_of(d) not in (None, "arriving", "terminated")]


def types(d: Daemon) -> list[str]:
    return [r["type"] for r in d.json("log", "mover") if r["type"].startswith("migration.")]


def test_the_copy_is_held_arriving_until_the_source_commits_then_is_live() -> None:
    with pair(source_fault="migrate-after-commit") as (source, target):
        done = source.ctl("migrate", "mover", "--to", str(target.socket))
        assert done.returncode == 3  # the source died after its commit
        # Committed at the source, never told: the target holds it, not runnable.
        assert state_of(target) == "arriving"
        row = next(r for r in target.json("ps") if r["name"] == "mover")
        assert row["state"] == "arriving"
        assert "held until the source commits" in row["reason"]
        refused = target.ctl("activate", "mover")
        assert refused.returncode == 1
        assert "arriving" in refused.stderr
        assert "resolve mover --accept" in refused.stderr
        assert target.ctl("send", "mover", "hi").returncode == 1
        assert target.ctl("cancel", "mover").returncode == 1
        assert target.ctl("fork", "mover", "--as", "copy").returncode == 1
        restart(source)  # it tells the target to finish
        wait_event(target, "mover", "migration.finished")
        assert state_of(source) == "terminated"
        assert live(source, target) == [target.root]
        assert state_of(target) == "sleeping"  # what it was at the source
        assert types(target) == ["migration.started", "migration.arriving", "migration.finished"]
        assert target.json("ps")[0]["next_wake"] == "on message"  # armed again
        target.ctl("send", "mover", "after the move", check=True)
        wait_event(target, "mover", "run.finished")


def test_a_source_killed_after_the_prepare_keeps_the_session_and_the_copy_goes() -> None:
    with pair(source_fault="migrate-after-prepare") as (source, target):
        source.ctl("migrate", "mover", "--to", str(target.socket))
        assert state_of(target) == "arriving"
        restart(source)  # not committed: it aborts, and tells the target to drop its copy
        target.wait_line("handover.discarded")
        assert state_of(target) is None
        assert live(source, target) == [source.root]
        assert types(source) == ["migration.started", "migration.aborted"]
        kept = list((target.state_dir / "discarded").iterdir())
        assert len(kept) == 1  # moved aside, not deleted
        source.ctl("send", "mover", "still here", check=True)
        wait_event(source, "mover", "run.finished")


def test_a_source_killed_before_it_sent_anything_keeps_the_session() -> None:
    with pair(source_fault="migrate-after-started") as (source, target):
        source.ctl("migrate", "mover", "--to", str(target.socket))
        restart(source)
        wait_for(lambda: not list((source.state_dir / "handovers").glob("*.json")), what="told")
        assert live(source, target) == [source.root]
        assert types(source) == ["migration.started", "migration.aborted"]


def test_a_target_killed_after_the_prepare_drops_its_copy_when_it_asks() -> None:
    with pair(target_fault="arrive-after-prepare") as (source, target):
        done = source.ctl("migrate", "mover", "--to", str(target.socket))
        assert done.returncode == 1  # no answer came: not committed
        assert "stays here" in done.stderr
        assert state_of(source) == "sleeping"
        restart(target)  # its copy is arriving; it asks the source: aborted
        target.wait_line("handover.discarded")
        assert live(source, target) == [source.root]


def test_a_target_killed_before_the_finish_finishes_it_at_restart() -> None:
    with pair(target_fault="arrive-before-finish") as (source, target):
        moved = source.json("migrate", "mover", "--to", str(target.socket))
        assert (moved["state"], moved["outcome"]) == ("terminated", "migrated")
        assert moved["handover_finished"] is False  # told again later
        restart(target)  # it asks the source: committed
        wait_event(target, "mover", "migration.finished")
        assert live(source, target) == [target.root]


def test_a_target_killed_after_the_finish_is_told_again_and_stays_live() -> None:
    with pair(target_fault="arrive-after-finish") as (source, target):
        moved = source.json("migrate", "mover", "--to", str(target.socket))
        assert moved["handover_finished"] is False
        restart(target)
        assert live(source, target) == [target.root]
        markers = source.state_dir / "handovers"
        # the source tells it again (a growing delay) until it acknowledges
        wait_for(lambda: not list(markers.glob("*.json")), timeout=30, what="the finish told")
        assert live(source, target) == [target.root]
        assert types(target).count("migration.finished") == 1


def test_an_arriving_copy_whose_source_is_gone_is_accepted_by_an_operator() -> None:
    with pair(source_fault="migrate-after-commit") as (source, target):
        source.ctl("migrate", "mover", "--to", str(target.socket))
        assert source.proc is not None
        assert source.proc.wait(30) == -9  # and it never comes back
        rerun = target.ctl("resolve", "mover", "--rerun")
        assert rerun.returncode == 1
        assert "--accept makes this copy live" in rerun.stderr
        target.ctl("resolve", "mover", "--accept", check=True)
        assert state_of(target) == "sleeping"
        finished = target.json("log", "mover", "--type", "migration.finished")[-1]["data"]
        assert finished["by"] == "operator"
        assert finished["uid"] is not None


def test_an_arriving_copy_whose_source_is_gone_is_discarded_by_an_operator() -> None:
    with pair(source_fault="migrate-after-prepare") as (source, target):
        source.ctl("migrate", "mover", "--to", str(target.socket))
        assert source.proc is not None
        assert source.proc.wait(30) == -9
        target.ctl("resolve", "mover", "--discard", check=True)
        assert state_of(target) is None
        restart(source)  # back after all: its hand-over never committed
        wait_for(lambda: not list((source.state_dir / "handovers").glob("*.json")), what="told")
        assert live(source, target) == [source.root]


def test_a_session_with_a_70_kb_goal_is_live_on_the_target_only() -> None:
    """The original failure: the answer to the import was read with a 64 KiB line
    limit, after the target had imported; the session stayed live on both."""
    roots = [short_dir(), short_dir()]
    try:
        source, target = Daemon(roots[0]).start(), Daemon(roots[1]).start()
        spec = source.write_spec("mover", MOVER.format(goal="g" * 70_000))
        source.ctl("create", str(spec), check=True)
        moved = source.json("migrate", "mover", "--to", str(target.socket))
        assert moved["handover_finished"] is True
        assert live(source, target) == [target.root]
        far = source.ctl("migrate", "mover", "--to", "ssh://elsewhere")
        assert far.returncode == 2
        assert "this host" in far.stderr
        assert len(target.json("show", "mover")["goal"]) == 70_000
        source.stop()
        target.stop()
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
