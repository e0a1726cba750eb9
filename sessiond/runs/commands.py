"""A command run for a session that is not its run: a ``[compact] exec``.

It starts the way the session's program does (sessiond.runs.start.Starter.
session_program): through the spawner, in a holder of its own, in a cgroup of
its own, as ``[run] user``, carrying the run mark, with the environment a run
gets from the daemon (none of the daemon's own variables). The control socket
therefore takes it and everything it starts for a run's process
(sessiond.ipc.runpeer): it may only ping there.

It is bounded like a run: a timeout, at most ``max_output`` bytes of output
(more stops it), and its end is the end of everything it started (the holder
kills its subtree when the command exits; the output is read to its end only
after that, so a child that kept stdout open cannot hold the caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sessiond.runs.cgroups import CgroupError
from sessiond.runs.leftovers import MARK, mark
from sessiond.runs.program import Outcome, scrubbed_env
from sessiond.runs.start import Starter
from sessiond.table.sessions import Session
from sessiond.table.spec import RunSpec, SessionSpec


class CommandNotStarted(Exception):
    """The command could not start (a missing program, no cgroup): why."""


@dataclass(frozen=True)
class CommandResult:
    outcome: Outcome
    over: bool  # it printed more than its bound on stdout (it was stopped)


async def run_for_session(
    starter: Starter,
    s: Session,
    argv: list[str],
    *,
    purpose: str,
    cwd: str,
    stdin: bytes,
    timeout: float,
    max_output: int,
) -> CommandResult:
    """Run ``argv`` for session ``s`` with ``stdin`` as its standard input, until it
    and everything it started are gone. ``purpose`` names it in its run mark and
    cgroup (``compact``). CommandNotStarted: it could not start."""
    assert s.spec is not None
    ctx = starter.ctx
    proc_id = f"{purpose}-{secrets.token_hex(4)}"  # two may run at once for a session
    env = scrubbed_env(ctx.env)
    env["SESSIOND_SESSION"] = s.name
    env[MARK] = mark(ctx.config.state_dir, s.name, proc_id)
    spec = _as_run(s.spec, argv, cwd, ctx.config.state_dir / "homes" / s.name)
    try:
        # confined as the session's runs are: the same sandbox, uid and hidden paths
        plan = await ctx.confinement(s, spec)
    except OSError as exc:  # SandboxUnavailable: it must not start
        raise CommandNotStarted(f"could not start {argv[0]!r}: {exc}") from None
    # A file, not a pipe: whatever its size, the command reads it at its pace and
    # the daemon never waits on a command that does not read.
    items = os.memfd_create(f"sessiond-{purpose}-stdin", os.MFD_CLOEXEC)
    try:
        _write_all(items, stdin)
        os.lseek(items, 0, os.SEEK_SET)
        assert spec.run is not None
        program = starter.session_program(
            s.spec,
            env=env,
            timeout=timeout,
            max_output=max_output,
            argv=argv,
            cwd=spec.run.cwd,
            stdin=items,
        )
        program.plan = plan
        try:
            program.cgroup = starter.cgroup_for(s, proc_id, sandboxed=plan is not None)
            program.send()
        except (OSError, ValueError, CgroupError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise CommandNotStarted(f"could not start {argv[0]!r}: {why}") from None
    finally:
        os.close(items)  # the spawner holds its own copy until the holder takes it
    try:
        await program.start()
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise CommandNotStarted(f"could not start {argv[0]!r}: {why}") from None
    program.go()
    ended = asyncio.ensure_future(program.wait())
    over = asyncio.ensure_future(program.output_over())
    try:
        await asyncio.wait({ended, over}, return_when=asyncio.FIRST_COMPLETED)
        stopped = over.done() and not ended.done()
        if stopped:
            await program.stop(f"its output passed {max_output} bytes")
        outcome = await ended
    except BaseException:
        # Cancelled (the daemon stopping, the client gone): it does not go on.
        await asyncio.shield(program.stop("cancelled"))
        raise
    finally:
        over.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await over
    return CommandResult(outcome, outcome.stdout_total > max_output)


def _as_run(spec: SessionSpec, argv: list[str], cwd: str, private: Path) -> SessionSpec:
    """``spec`` as if ``argv`` were its program, for the sandbox's plan: its run's
    declarations (writes, writable, network...) stand. A session with no ``[run]``
    has no workspace: its command works in a private folder (the session's run home),
    never in the daemon's own or the root of the file system."""
    if spec.run is not None:
        run = spec.run.model_copy(update={"exec": argv, "cwd": cwd})
        return spec.model_copy(update={"run": run})
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    return spec.model_copy(update={"run": RunSpec(exec=argv, cwd=str(private))})


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
