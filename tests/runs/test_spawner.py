"""The spawner process itself (sessiond/runs/spawner.py), driven through the
daemon's side of it (sessiond/runs/spawner_client.py): real processes, no daemon."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from sessiond.runs.program import check_startable
from sessiond.runs.spawner_client import Held, Request, SpawnerClient
from tests.e2e.harness import alive, wait_for


async def spawn(spawner: SpawnerClient, script: str, cwd: Path) -> tuple[Held, int]:
    """A held ``sh -c script``; its stdout's read end."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        held = await spawner.spawn(
            ["sh", "-c", script], cwd=str(cwd), env={"PATH": os.defpath}, stdout=out_w, stderr=err_w
        )
    finally:
        os.close(out_w)
        os.close(err_w)
        os.close(err_r)
    return held, out_r


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def test_a_held_program_never_runs_if_the_daemon_goes_away(tmp_path: Path) -> None:
    async def main() -> None:
        spawner = SpawnerClient()
        held, out = await spawn(spawner, "echo ran > ran.txt", tmp_path)
        assert alive(held.pid)
        await spawner.close()  # as the kernel does when the daemon dies
        os.close(out)
        wait_for(lambda: not alive(held.pid), what="the holder's end")

    asyncio.run(main())
    assert not (tmp_path / "ran.txt").exists()  # and nothing is left that could write it


@pytest.mark.parametrize(
    ("script", "code"), [("exit 3", 3), ("exit 0", 0), ("kill -TERM $$", -signal.SIGTERM)]
)
def test_the_holder_ends_with_the_programs_own_status(
    tmp_path: Path, script: str, code: int
) -> None:
    async def main() -> int:
        spawner = SpawnerClient()
        held, out = await spawn(spawner, script, tmp_path)
        spawner.go(held)
        status = await asyncio.wait_for(held.exited, 30)
        os.close(out)
        await spawner.close()
        return os.waitstatus_to_exitcode(status)

    assert asyncio.run(main()) == code


def test_what_the_program_leaves_is_killed_when_it_exits(tmp_path: Path) -> None:
    """A child in a session of its own, holding the output pipe: the run ends all
    the same, and the child with it."""

    async def main() -> int:
        spawner = SpawnerClient()
        held, out = await spawn(
            spawner, "setsid sleep 1000 & echo $!; setsid sh -c 'sleep 1000' & echo $!", tmp_path
        )
        spawner.go(held)
        await asyncio.wait_for(held.exited, 30)
        left = [int(p) for p in read_all(out).split()]  # EOF: nothing holds the pipe
        await spawner.close()
        return len([p for p in left if alive(p)])

    assert asyncio.run(main()) == 0


def test_check_startable_refuses_what_exec_would(tmp_path: Path) -> None:
    env = {"PATH": os.defpath}
    check_startable(["sh", "-c", "true"], str(tmp_path), env)
    with pytest.raises(FileNotFoundError):
        check_startable(["no-such-program-here"], str(tmp_path), env)
    with pytest.raises(FileNotFoundError):
        check_startable(["sh"], str(tmp_path / "missing"), env)
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(PermissionError):
        check_startable(["./plain.txt"], str(tmp_path), env)
    with pytest.raises(ValueError, match="null"):
        check_startable(["sh", "a\0b"], str(tmp_path), env)


def _send(spawner: SpawnerClient, script: str, cwd: Path) -> Request:
    out_r, out_w = os.pipe()
    try:
        return spawner.send(
            ["sh", "-c", script], cwd=str(cwd), env={"PATH": os.defpath}, stdout=out_w, stderr=out_w
        )
    finally:
        os.close(out_w)
        os.close(out_r)


def test_the_next_holder_is_told_ahead_and_taken_by_the_next_spawn(tmp_path: Path) -> None:
    """run.started is recorded with the holder's pid while the request travels:
    the spawner must hand the request to exactly that holder."""

    async def main() -> None:
        spawner = SpawnerClient()
        spawner.start()

        async def told() -> None:
            while spawner.idle is None:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(told(), 30)
        assert spawner.idle is not None
        pid, start = spawner.idle
        request = _send(spawner, "exit 0", tmp_path)
        assert request.holder == (pid, start)
        assert spawner.idle is None  # taken
        held = await spawner.answer(request)
        assert (held.pid, held.start) == (pid, start)
        spawner.go(held)
        assert await asyncio.wait_for(held.exited, 30) == 0
        await spawner.close()

    asyncio.run(main())


def test_a_burst_of_spawns_all_start_whatever_the_spawner_told_meanwhile(tmp_path: Path) -> None:
    """A spawn naming no holder may take the one the spawner is announcing: that
    announcement must not be used by the next spawn (it would be refused)."""

    async def main() -> None:
        spawner = SpawnerClient()
        spawner.start()
        first = _send(spawner, "exit 0", tmp_path)  # nothing told yet: names no holder
        assert first.holder is None

        async def told_or_answered() -> None:
            while spawner.idle is None and not first.reply.done():
                await asyncio.sleep(0)

        await asyncio.wait_for(told_or_answered(), 30)
        requests = [first] + [_send(spawner, "exit 0", tmp_path) for _ in range(4)]
        helds = [await asyncio.wait_for(spawner.answer(r), 30) for r in requests]
        assert len({h.pid for h in helds}) == 5
        for held in helds:
            spawner.go(held)
        for held in helds:
            assert await asyncio.wait_for(held.exited, 30) == 0
        await spawner.close()

    asyncio.run(main())
