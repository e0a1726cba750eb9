"""Running a session's program: held by the spawner, in a session of its own.

The program's stdout and stderr become artifacts referenced from
``run.finished``. Stopping a run signals every process of it (SIGTERM), then
kills them all (SIGKILL) after the grace period; its end is the end of all of
them (see sessiond/runs/spawner.py). A run with a cgroup of its own
(sessiond.runs.cgroups) is also killed through it, and the group is removed
once the run is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import structlog

from sessiond.log.event_records import RunWake
from sessiond.runs.cgroups import CgroupError, RunCgroup
from sessiond.runs.sandbox import MountPlan, confine
from sessiond.runs.spawner_client import Held, Request, SpawnerClient
from sessiond.table.spec import SessionSpec

log = structlog.get_logger(__name__)

WAKE_ENV_LIMIT = 32 * 1024
DRAIN_AFTER_EXIT = 2.0  # seconds the output may take to reach EOF once the run is gone
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


def wake_payload(wakes: list[RunWake], epoch: int = 0) -> tuple[str, bytes]:
    """SESSIOND_WAKE (cut to 32 KiB, with a `truncated` flag) and the whole cause,
    with the run's fencing epoch (SESSIOND_EPOCH) in the file."""
    whole = orjson.dumps({"wakes": wakes, "truncated": False, "epoch": epoch})
    if len(whole) <= WAKE_ENV_LIMIT:
        return whole.decode(), whole
    kept: list[RunWake] = []
    for wake in wakes:
        trial = orjson.dumps({"wakes": [*kept, wake], "truncated": True})
        if len(trial) > WAKE_ENV_LIMIT:
            break
        kept.append(wake)
    if not kept and wakes:
        kept = [{"trigger": wakes[0]["trigger"], "details": {}, "cut": True}]
    return orjson.dumps({"wakes": kept, "truncated": True}).decode(), whole


class Collect(asyncio.Protocol):
    """One output pipe of a run, read by the loop: the first ``limit`` bytes kept,
    all of them counted. What came is kept even when the read is cut short."""

    def __init__(self, limit: int, done: asyncio.Future[None]) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0
        self.done = done
        self.seen = asyncio.Event()  # the first byte came
        self.over = asyncio.Event()  # more than ``limit`` bytes came
        # readers of the output as it comes (sessionctl output -f): woken on data or EOF
        self.waiters: list[asyncio.Future[None]] = []

    def data_received(self, data: bytes) -> None:
        self.total += len(data)
        self.seen.set()
        if self.total > self.limit:
            self.over.set()
        if len(self.kept) < self.limit:
            self.kept += data[: self.limit - len(self.kept)]
        self._wake()

    def _wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def eof_received(self) -> bool:
        self._finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002 - EOF or error alike
        self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        self._wake()


def _same(collect: Collect) -> Collect:
    return collect


def check_startable(argv: list[str], cwd: str, env: dict[str, str]) -> None:
    """Refuse, before anything is spawned, what exec would refuse: a missing or
    non-executable program, a missing folder, a NUL in an argument or value (the
    error a start failure reports, the way subprocess would raise it)."""
    for text in (*argv, *env, *env.values(), cwd):
        if "\0" in text:
            raise ValueError("embedded null byte")
    if not os.path.isdir(cwd):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), cwd)
    name = argv[0]
    if "/" in name:
        path: str | None = os.path.join(cwd, name)
    else:
        path = shutil.which(name, path=env.get("PATH", os.defpath))
        if path is not None and not os.path.isabs(path):  # a relative PATH entry
            path = os.path.join(cwd, path)
    if path is None or not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)


class Program:
    """One run of a session's program, held by the spawner (sessiond/runs/spawner.py).

    ``start`` spawns it held: its holder R exists (its pid is the run's) and the
    program has not executed anything. ``go`` lets it exec, once ``run.started``
    is on record. The run ends when the holder is gone, which is when the
    program and every process it left are gone; the pipes never hold it open.

    It is also how any other process is started on a session's behalf (a
    ``[compact] exec`` command: ``argv``, ``cwd`` and ``stdin`` given, and the
    spec may have no ``[run]``): the same holder, cgroup, user and mark as a run.
    """

    def __init__(
        self,
        spec: SessionSpec,
        *,
        env: dict[str, str],
        max_output: int,
        grace: float,
        spawner: SpawnerClient,
        timeout: float | None = None,
        cgroup: RunCgroup | None = None,
        user: tuple[int, int] | None = None,
        argv: list[str] | None = None,
        cwd: str | None = None,
        stdin: int | None = None,
    ) -> None:
        if argv is None or cwd is None or timeout is None:
            assert spec.run is not None, "a process that is not the session's run names its own"
            argv = list(spec.run.exec) if argv is None else argv
            cwd = str(spec.run.cwd) if cwd is None else cwd
            timeout = spec.run.timeout if timeout is None else timeout
        self.spec = spec
        self.argv, self.cwd = argv, cwd
        self.stdin = stdin  # a file the program reads as stdin (the caller closes it)
        self.env = env
        self.max_output = max_output
        self.grace = grace
        self.spawner = spawner
        self.timeout = timeout
        self.cgroup = cgroup  # the run's own, made empty by the caller; removed here
        self.user = user  # [run] user: the program's uid and gid
        # the session's sandbox (RunContext.confinement); None: the operator turned it off
        self.plan: MountPlan | None = None
        self.held: Held | None = None
        self._request: Request | None = None  # sent, its answer not awaited yet
        self._pipes: tuple[int, int] = (-1, -1)  # our ends of stdout and stderr
        self.proc_start: int | None = None
        self._outputs: list[Collect] = []
        self._transports: list[asyncio.BaseTransport] = []
        self._stop_reason: str | None = None

    def send(self) -> tuple[int, int | None] | None:
        """Ask the spawner for the program, held; the holder's pid and start time
        when they are known before the answer (``start`` awaits it). OSError or
        ValueError: it cannot start."""
        argv, cwd, user = self.argv, self.cwd, self.user
        try:
            check_startable(argv, cwd, self.env)
        except BaseException:
            self._remove_cgroup()
            raise
        if self.plan is not None:  # bubblewrap starts as the daemon, drops inside
            argv, user = confine(argv, self.plan), None
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        procs = [str(f / "cgroup.procs") for f in self.cgroup.folders] if self.cgroup else None
        try:
            self._request = self.spawner.send(
                argv,
                cwd=cwd,
                env=self.env,
                stdout=out_w,
                stderr=err_w,
                cgroup_procs=procs,
                user=user,
                stdin=self.stdin,
                sandboxed=self.plan is not None,
            )
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            self._remove_cgroup()
            raise
        finally:
            os.close(out_w)  # the spawner has its copies; ours would hold the pipes open
            os.close(err_w)
        self._pipes = (out_r, err_r)
        return self._request.holder

    async def start(self) -> int:
        """Spawn the program held (``send``, if not done yet, and its answer); R's
        pid. OSError or ValueError: it cannot start."""
        if self._request is None:
            self.send()
        assert self._request is not None
        out_r, err_r = self._pipes
        try:
            self.held = await self.spawner.answer(self._request)
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            # Refused, or cancelled before its answer: the holder never went (it
            # is stopped when the answer comes) and leaves the group soon.
            self._release_later(None)
            raise
        self.proc_start = self.held.start
        loop = asyncio.get_running_loop()
        try:
            for fd in (out_r, err_r):
                await self._read(loop, fd)
        except BaseException:
            # Spawned but not to be supervised (cancelled at shutdown, no fds left):
            # it never goes, and its holder is gone with whatever it started.
            self.held.drop_go()
            self.spawner.kill(self.held)
            self._release_later(self.held)
            self.close_pipes()
            for fd in (out_r, err_r)[len(self._outputs) :]:
                os.close(fd)
            raise
        return self.held.pid

    async def _read(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        collect = Collect(self.max_output, loop.create_future())
        # The loop's transport closes the fd; the file object must not (closefd).
        pipe = open(fd, "rb", buffering=0, closefd=False)  # noqa: SIM115 - the transport owns fd
        transport, _ = await loop.connect_read_pipe(functools.partial(_same, collect), pipe)
        self._outputs.append(collect)
        self._transports.append(transport)

    @property
    def pid(self) -> int:
        assert self.held is not None
        return self.held.pid

    def go(self) -> None:
        """The run is on record: let the program exec."""
        assert self.held is not None
        self.spawner.go(self.held)

    async def output_over(self) -> None:
        """Returns once the program has printed more than ``max_output`` bytes on stdout."""
        await self._outputs[0].over.wait()

    def output_so_far(self, stream: int) -> bytes:
        """What the program has printed so far on stdout (0) or stderr (1), as kept."""
        return bytes(self._outputs[stream].kept) if len(self._outputs) > stream else b""

    def output_changed(self) -> asyncio.Future[None]:
        """Done once either pipe gets more output or ends."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for collect in self._outputs:
            collect.waiters.append(waiter)
        return waiter

    async def output_seen(self, timeout: float) -> None:
        """Test only (the ``during-work`` fault point): the program has begun to work."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._outputs[0].seen.wait(), timeout)

    async def wait(self) -> Outcome:
        held = self.held
        assert held is not None
        started = time.monotonic()
        timed_out = False
        try:
            status = await asyncio.wait_for(asyncio.shield(held.exited), self.timeout)
        except TimeoutError:
            timed_out = True
            await self.stop("timeout")
            status = await asyncio.shield(held.exited)
        await self.release_cgroup()
        # Every process of the run is gone: the pipes are at EOF, or are about to be.
        # Something outside the run could still hold them (an fd passed away over a
        # socket): the drain is bounded, never a reason to stay running.
        done = [c.done for c in self._outputs]
        if done:
            await asyncio.wait(done, timeout=DRAIN_AFTER_EXIT)
        self.close_pipes()
        code = os.waitstatus_to_exitcode(status)
        duration = int((time.monotonic() - started) * 1000)
        sig = -code if code < 0 else None
        if timed_out:
            status_text = "timeout"
        elif self._stop_reason is not None:
            status_text = "interrupted" if sig in (None, signal.SIGTERM) else "killed"
        elif code == 0:
            status_text = "ok"
        else:
            status_text = "failed"
        out, err = self._outputs
        return Outcome(
            status_text,
            code if code >= 0 else None,
            sig,
            duration,
            bytes(out.kept),
            bytes(err.kept),
            out.total,
            err.total,
        )

    def close_pipes(self) -> None:
        for transport in self._transports:
            transport.close()
        self._transports.clear()

    async def stop(self, reason: str) -> None:
        """SIGTERM to every process of the run, SIGKILL to all of them after the
        grace period; returns once they are all gone."""
        held = self.held
        if held is None or held.exited.done():
            return
        if self._stop_reason is None:
            self._stop_reason = reason
        self.spawner.term(held)
        try:
            await asyncio.wait_for(asyncio.shield(held.exited), self.grace)
        except TimeoutError:
            self.spawner.kill(held)
            if self.cgroup is not None:  # cgroup.kill: the whole group, forks in flight too
                await self.release_cgroup()
            await asyncio.shield(held.exited)

    async def release_cgroup(self) -> None:
        """Kill what is left in the run's cgroup, then remove it (once only). Called
        when the holder is gone, or to stop the run: the group is only removed once
        it is empty. A failure is logged; the next start-up's sweep retries."""
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is None:
            return
        try:
            await asyncio.to_thread(_kill_and_remove, cgroup)
        except (CgroupError, OSError) as exc:
            log.error("run.cgroup_left", cgroup=cgroup.name, error=str(exc))

    def _remove_cgroup(self) -> None:
        """The group of a run that spawned nothing: empty, removed at once."""
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            try:
                cgroup.remove()
            except (CgroupError, OSError) as exc:
                log.error("run.cgroup_left", cgroup=cgroup.name, error=str(exc))

    def _release_later(self, held: Held | None) -> None:
        """A start given up: the group goes once its holder has (``held`` None: no
        holder answered; one that did not join leaves the group empty)."""
        if self.cgroup is None:
            return
        if held is None:
            self._remove_cgroup()  # EBUSY if a holder joined: logged, swept later
            return
        task = asyncio.ensure_future(self._release_after(held))
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)

    async def _release_after(self, held: Held) -> None:
        await asyncio.shield(held.exited)
        await self.release_cgroup()


_RELEASING: set[asyncio.Future[None]] = set()  # referenced until done


def _kill_and_remove(cgroup: RunCgroup) -> None:
    cgroup.kill()
    cgroup.remove()


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def program_env(
    base: dict[str, str],
    spec: SessionSpec,
    profile_env: dict[str, str],
    *,
    run_id: str,
    wakes: list[RunWake],
    wake_file: Path,
    epoch: int = 0,
) -> dict[str, str]:
    """The environment of a run: the daemon's, the profile's, the spec's, then ours
    (``epoch``: the session's ownership epoch it runs under, its fencing token)."""
    env = scrubbed_env(base)
    env.update(profile_env)
    if spec.run is not None:
        env.update(spec.run.env)
    wake_env, whole = wake_payload(wakes, epoch)
    wake_file.write_bytes(whole)
    env.update(
        SESSIOND_SESSION=spec.name,
        SESSIOND_RUN=run_id,
        SESSIOND_GOAL=spec.goal,
        SESSIOND_WAKE=wake_env,
        SESSIOND_WAKE_FILE=str(wake_file),
        SESSIOND_EPOCH=str(epoch),
    )
    return env


def scrubbed_env(base: dict[str, str]) -> dict[str, str]:
    """The daemon's environment as any process of a session gets it: without the
    daemon's own variables (``SESSIOND_*``: its control socket among them) and
    systemd's."""
    return {k: v for k, v in base.items() if not k.startswith("SESSIOND_") and k not in SYSTEMD_ENV}
