"""Running a session's program: a child process in its own process group.

The program's stdout and stderr become artifacts referenced from
``run.finished``. Stopping a run signals the whole process group (SIGTERM),
then kills it (SIGKILL) after the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from sessiond.table.spec import SessionSpec

WAKE_ENV_LIMIT = 32 * 1024
# systemd's variables for the daemon itself; a session program must not see them
SYSTEMD_ENV = frozenset(
    {"NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_USEC", "WATCHDOG_PID"}
)


@dataclass
class Outcome:
    status: str  # ok | failed | interrupted | killed | timeout
    exit_code: int | None
    signal: int | None
    duration_ms: int
    stdout: bytes
    stderr: bytes
    stdout_total: int
    stderr_total: int
    error: str = ""


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22),
    so a later check can tell this process from another that reused its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def wake_payload(wakes: list[dict[str, Any]]) -> tuple[str, bytes]:
    """SESSIOND_WAKE (cut to 32 KiB, with a `truncated` flag) and the whole cause."""
    whole = orjson.dumps({"wakes": wakes, "truncated": False})
    if len(whole) <= WAKE_ENV_LIMIT:
        return whole.decode(), whole
    kept: list[dict[str, Any]] = []
    for wake in wakes:
        trial = orjson.dumps({"wakes": [*kept, wake], "truncated": True})
        if len(trial) > WAKE_ENV_LIMIT:
            break
        kept.append(wake)
    if not kept and wakes:
        kept = [{"trigger": wakes[0].get("trigger"), "details": {}, "cut": True}]
    return orjson.dumps({"wakes": kept, "truncated": True}).decode(), whole


async def _drain(stream: asyncio.StreamReader | None, limit: int) -> tuple[bytes, int]:
    if stream is None:
        return b"", 0
    kept = bytearray()
    total = 0
    while True:
        chunk = await stream.read(1 << 16)
        if not chunk:
            return bytes(kept), total
        total += len(chunk)
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]


class Child:
    """A started program, driven from the event loop.

    Started with ``subprocess.Popen`` (vfork and exec: about 0.5 ms with a daemon's
    heap) rather than the loop's own spawn (uvloop forks the whole process: 3 to 4
    ms, paid by every run between its wake and its first instruction). Its pipes
    become StreamReaders of the loop, and its exit is seen through a pidfd (a
    thread that waits, where there are no pidfds), never by polling.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.returncode: int | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._exited: asyncio.Future[int] | None = None
        self._transports: list[asyncio.BaseTransport] = []

    @classmethod
    async def start(cls, argv: list[str], *, cwd: str, env: dict[str, str]) -> Child:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: cancel stops all of it
            close_fds=True,
        )
        child = cls(popen)
        try:
            await child._attach(asyncio.get_running_loop())
        except BaseException:
            # Started but not supervised (cancelled at shutdown, no fds left): it must
            # not go on unseen. Killed with its group, reaped, its pipes closed.
            signal_group(popen.pid, signal.SIGKILL)
            popen.wait()
            child.close_pipes()
            raise
        return child

    async def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        for name in ("stdout", "stderr"):
            owned: IO[bytes] = getattr(self.popen, name)
            # The loop's transport takes the fd and closes it; a file object left
            # holding the same number would close it a second time, later, whatever
            # the number has become by then. So the transport gets a copy and the
            # original is closed now.
            fd = os.dup(owned.fileno())
            owned.close()
            setattr(self.popen, name, None)
            pipe = open(fd, "rb", buffering=0, closefd=False)  # noqa: SIM115 - the transport owns fd
            reader = asyncio.StreamReader(limit=1 << 16, loop=loop)
            try:
                transport, _ = await loop.connect_read_pipe(
                    functools.partial(asyncio.StreamReaderProtocol, reader), pipe
                )
            except BaseException:
                os.close(fd)
                raise
            self._transports.append(transport)
            setattr(self, name, reader)
        self._exited = loop.create_future()
        self._watch_exit(loop)

    def close_pipes(self) -> None:
        """Close the read ends once drained (a transport at EOF only stops reading)."""
        for transport in self._transports:
            transport.close()
        self._transports.clear()
        for name in ("stdout", "stderr"):
            owned = getattr(self.popen, name)
            if owned is not None:
                owned.close()

    def _watch_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._exited is not None
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfds here: a thread of its own waits
            # (not the loop's executor: a long program would hold one of its few
            # workers for its whole life)
            def wait() -> None:
                code = self.popen.wait()
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    loop.call_soon_threadsafe(self._set_exit, code)

            threading.Thread(target=wait, name=f"wait-{self.pid}", daemon=True).start()
            return

        def readable() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._set_exit(self.popen.wait())  # exited: the reap does not block

        loop.add_reader(pidfd, readable)

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(code)

    async def wait(self) -> int:
        assert self._exited is not None
        return await asyncio.shield(self._exited)


class Program:
    """One run of a session's program."""

    def __init__(
        self,
        spec: SessionSpec,
        *,
        env: dict[str, str],
        max_output: int,
        grace: float,
        timeout: float | None = None,
    ) -> None:
        assert spec.run is not None
        self.spec = spec
        self.run = spec.run
        self.env = env
        self.max_output = max_output
        self.grace = grace
        self.timeout = timeout if timeout is not None else spec.run.timeout
        self.proc: Child | None = None
        self._stop_reason: str | None = None

    async def start(self) -> int:
        self.proc = await Child.start(list(self.run.exec), cwd=str(self.run.cwd), env=self.env)
        return self.proc.pid

    async def wait(self) -> Outcome:
        proc = self.proc
        assert proc is not None
        started = time.monotonic()
        drains = asyncio.gather(
            _drain(proc.stdout, self.max_output), _drain(proc.stderr, self.max_output)
        )
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), self.timeout)
        except TimeoutError:
            timed_out = True
            await self.stop("timeout")
        (out, out_total), (err, err_total) = await drains
        proc.close_pipes()
        code = proc.returncode
        assert code is not None
        duration = int((time.monotonic() - started) * 1000)
        sig = -code if code < 0 else None
        if timed_out:
            status = "timeout"
        elif self._stop_reason is not None:
            status = "interrupted" if sig in (None, signal.SIGTERM) else "killed"
        elif code == 0:
            status = "ok"
        else:
            status = "failed"
        return Outcome(
            status,
            code if code >= 0 else None,
            sig,
            duration,
            out,
            err,
            out_total,
            err_total,
        )

    async def stop(self, reason: str) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        self._stop_reason = reason
        signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), self.grace)
        except TimeoutError:
            signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
        # Children left in the group after the leader exits go too.
        signal_group(proc.pid, signal.SIGKILL)


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def program_env(
    base: dict[str, str],
    spec: SessionSpec,
    profile_env: dict[str, str],
    *,
    run_id: str,
    wakes: list[dict[str, Any]],
    wake_file: Path,
) -> dict[str, str]:
    """The environment of a run: the daemon's, the profile's, the spec's, then ours."""
    env = {k: v for k, v in base.items() if not k.startswith("SESSIOND_") and k not in SYSTEMD_ENV}
    env.update(profile_env)
    if spec.run is not None:
        env.update(spec.run.env)
    wake_env, whole = wake_payload(wakes)
    wake_file.write_bytes(whole)
    env.update(
        SESSIOND_SESSION=spec.name,
        SESSIOND_RUN=run_id,
        SESSIOND_GOAL=spec.goal,
        SESSIOND_WAKE=wake_env,
        SESSIOND_WAKE_FILE=str(wake_file),
    )
    return env
