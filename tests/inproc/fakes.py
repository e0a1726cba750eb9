"""The fast loop's programs: scripted coroutines a fake spawner runs, with no
process (tests/inproc/harness.py wires it in place of the spawner)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import orjson

from sessiond.runs.spawner_client import Held, Request, SpawnerClient
from sessiond.wire import Frame, RemoteError, result_of

if TYPE_CHECKING:
    from tests.inproc.harness import Harness

BOUND = 60.0  # seconds: a wait that takes longer is a hang, never a slow machine
FAKE_PIDS = 4_190_000  # above any real pid (pid_max is at most 4,194,304)


Script = Callable[["FakeRun"], Awaitable[int]]


class FakeRun:
    """What a scripted program sees and does: its argv, environment and wakes; its
    output on the run's real pipes; the daemon through the program endpoint."""

    def __init__(self, harness: Harness, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.harness = harness
        self.argv, self.env, self.cwd = argv, env, cwd
        self.session = env.get("SESSIOND_SESSION", "")
        self.run_id = env.get("SESSIOND_RUN", "")
        self.token = env.get("SESSIOND_TOKEN", "")
        self.wakes: dict[str, Any] = orjson.loads(env.get("SESSIOND_WAKE") or "{}")
        self.stdin = b""
        self._fds: list[int] = []

    async def out(self, data: str | bytes) -> None:
        await self._write(self._fds[0], data)

    async def err(self, data: str | bytes) -> None:
        await self._write(self._fds[1], data)

    async def _write(self, fd: int, data: str | bytes) -> None:
        view = memoryview(data.encode() if isinstance(data, str) else data)
        loop = asyncio.get_running_loop()
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:  # the daemon reads this pipe on the same loop
                ready = loop.create_future()
                loop.add_writer(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)

    async def call(self, method: str, **params: Any) -> Any:
        """One request on the program endpoint, as ``sessiond.sdk`` sends it."""
        params = {"token": self.token, "session": self.session, **params}
        return await self.harness.request(method, params, endpoint="program", token=self.token)

    async def ctl(self, method: str, **params: Any) -> Any:
        """A request as ``sessionctl`` in a run sends it: the run's token beside it,
        on the program endpoint (what the spec's ``grants`` let through)."""
        return await self.harness.request(method, params, endpoint="program", token=self.token)

    async def sdk(self, fn: Callable[[Any], int | None]) -> int:
        """Run ``fn(run)`` with the real SDK's ``Run`` (sessiond.sdk), blocking calls and
        all, in a thread; its requests come back to this loop's dispatch table. As
        ``sessiond.sdk.connect`` does, a ``StopRun`` leaving it ends the program with 0."""
        from sessiond.sdk import Run, StopRun

        conn = _ThreadConnection(self, asyncio.get_running_loop())
        run = Run(cast(Any, conn), self.token, self.session, self.run_id)

        def main() -> int:
            try:
                return fn(run) or 0
            except StopRun:
                return 0
            finally:
                with contextlib.suppress(RemoteError):
                    run._pipe.settle()  # no step's end left in flight

        return await asyncio.to_thread(main)

    async def source(self, prelude: str, body: str) -> int:
        """Run a program's Python source (``prelude``, then ``body``) as ``python
        program.py`` would, in a thread, from its run's folder: ``connect()`` gives
        the real SDK's ``Run`` on this run, a ``StopRun`` leaving it exits 0, and
        ``SystemExit`` is the exit code."""
        from sessiond.sdk import Run, StopRun

        conn = cast(Any, _ThreadConnection(self, asyncio.get_running_loop()))

        @contextlib.contextmanager
        def connect() -> Iterator[Run]:
            run = Run(conn, self.token, self.session, self.run_id)
            try:
                yield run
                run._pipe.settle()  # as sessiond.sdk.connect: no step's end left in flight
            except StopRun:
                raise SystemExit(0) from None
            finally:
                with contextlib.suppress(RemoteError):
                    run._pipe.settle()

        def main() -> int:
            os.chdir(self.cwd)  # the tests/inproc conftest puts the test's back
            # a program may leave a file to its exit to close (``open(p, "a").write``):
            # here no exit comes, and the collector's warning is not the program's
            # and a thread of the program that dies of an exception prints it on the
            # program's stderr: it is no failure of the test's own threads
            hook, threading.excepthook = threading.excepthook, lambda _args: None
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ResourceWarning)
                    return run()
            finally:
                threading.excepthook = hook

        def run() -> int:
            scope: dict[str, Any] = {"__name__": "__main__"}
            try:
                exec(compile(prelude, "prelude.py", "exec"), scope)  # a test's own program
                scope["connect"] = connect
                exec(compile(body, "program.py", "exec"), scope)
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            return 0

        return await asyncio.to_thread(main)


class _ThreadConnection:
    """``sessiond.wire.Connection`` for the SDK in a thread: each request is sent to
    the harness's loop, served after the one before it (as a connection's are), and
    its answer read in order."""

    def __init__(self, run: FakeRun, loop: asyncio.AbstractEventLoop) -> None:
        self.run, self.loop = run, loop
        self._sent: list[concurrent.futures.Future[Frame]] = []

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.send(method, params)
        return result_of(self.receive())

    def send(self, method: str, params: dict[str, Any]) -> int:
        before = self._sent[-1] if self._sent else None

        async def serve() -> Frame:
            if before is not None:
                await asyncio.wait([asyncio.wrap_future(before)])
            try:
                result = await self.run.harness.request(
                    method, params, endpoint="program", token=self.run.token
                )
            except RemoteError as exc:
                return {"ok": False, "error": {"code": exc.code, "message": exc.message,
                                               "exit": exc.exit_code}}  # fmt: skip
            return {"ok": True, "result": result}

        self._sent.append(asyncio.run_coroutine_threadsafe(serve(), self.loop))
        return len(self._sent)

    def receive(self) -> Frame:
        return self._sent.pop(0).result(BOUND)

    def close(self) -> None:
        pass


class FakeSpawner(SpawnerClient):
    """The spawner's interface with no process: ``go`` starts the script in a task,
    ``term`` cancels it (a script may catch that and exit as it likes), ``kill``
    ends it at once. Its end closes its pipes and answers ``Held.exited`` with a
    wait status, as the holder's end does."""

    def __init__(self, harness: Harness) -> None:
        super().__init__()
        self.harness = harness
        self.started: list[list[str]] = []  # every argv spawned, in order
        self._scripts: dict[int, tuple[FakeRun, Held]] = {}
        self._tasks: dict[int, asyncio.Task[int]] = {}

    def start(self) -> None:
        pass

    @property
    def pid(self) -> int | None:
        return None

    def send(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        stdout: int,
        stderr: int,
        cgroup_procs: list[str] | None = None,
        user: tuple[int, int] | None = None,
        stdin: int | None = None,
        sandboxed: bool = False,
    ) -> Request:
        del cgroup_procs, user, sandboxed  # what only a process has
        loop = asyncio.get_running_loop()
        rid = self._next
        self._next += 1
        run = FakeRun(self.harness, list(argv), dict(env), cwd)
        for fd in (stdout, stderr):
            mine = os.dup(fd)
            os.set_blocking(mine, False)
            run._fds.append(mine)
        if stdin is not None:
            run.stdin = os.pread(stdin, 1 << 24, 0)
        held = Held(rid, FAKE_PIDS + rid, None, loop.create_future())
        self._scripts[rid] = (run, held)
        self.started.append(list(argv))
        reply: asyncio.Future[Held] = loop.create_future()
        reply.set_result(held)
        return Request(rid, reply, None)

    def go(self, held: Held) -> None:
        run, _ = self._scripts[held.rid]
        task = asyncio.ensure_future(self.harness.script_for(run.argv)(run))
        self._tasks[held.rid] = task
        task.add_done_callback(lambda t: self._ended(held, t))

    def _ended(self, held: Held, task: asyncio.Task[int]) -> None:
        status: int
        if task.cancelled():
            status = signal.SIGTERM.value  # killed by the signal: the raw status is its number
        elif task.exception() is not None:
            status = 1 << 8
        else:
            status = (task.result() & 0xFF) << 8
        self._exit(held, status)

    def _exit(self, held: Held, status: int) -> None:
        entry = self._scripts.pop(held.rid, None)
        self._tasks.pop(held.rid, None)
        if entry is not None:
            for fd in entry[0]._fds:
                os.close(fd)
        if not held.exited.done():
            held.exited.set_result(status)

    def term(self, held: Held) -> None:
        task = self._tasks.get(held.rid)
        if task is None:  # never went (held, then stopped): it ends unexec'd
            self._exit(held, signal.SIGTERM)
        else:
            task.cancel()

    def kill(self, held: Held) -> None:
        task = self._tasks.get(held.rid)
        if task is not None:
            task.cancel()
        self._exit(held, signal.SIGKILL)

    def fence(self, at: float) -> None:
        pass

    async def close(self, timeout: float = 10.0) -> None:
        del timeout
        for rid in list(self._scripts):
            self.kill(self._scripts[rid][1])


async def true(_run: FakeRun) -> int:
    return 0


async def false(_run: FakeRun) -> int:
    return 1
