"""The daemon in one process: the fast loop's harness.

The real process table, Kernel, syscall families, triggers and dispatch table,
wired as ``sessiond.daemon`` wires them for one node (``build``), on the memory
store. What is not real:

* the spawner (tests/inproc/fakes.py): a program is a scripted coroutine
  (``Script``) that gets its run's environment, writes to the real output pipes
  and calls the daemon through the program endpoint's dispatch table, or runs
  the real SDK in a thread; ``true`` and ``false`` (and any argv without a
  script) behave as those programs do;
* the socket: a request is one JSON line handed to ``Dispatch.handle``, and its
  answer is read back from what it wrote, so the wire's decoding, the params
  models and the error answers are the daemon's own;
* the clock: the event loop's clock and the daemon's wall clock run on, and
  ``advance`` moves both forward at once, so a cron or ``every`` timer, a retry's
  backoff or a cool-down fires when the test says.

In the manner of arq's ``burst=True`` (run until there is nothing left to do)
and uvicorn's in-process server: ``idle`` returns once every background task
and every run has ended; ``event`` waits for an event in a session's log. No
test sleeps: each waits on a condition, with a bound that only catches a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson

from sessiond.config import DaemonConfig, load_config
from sessiond.daemon.service import Daemon
from sessiond.daemon.statedir import mask_key
from sessiond.ipc.dispatch import Caller, Dispatch
from sessiond.ipc.frames import Frames
from sessiond.log.store.base import Record, Store
from sessiond.log.store.memory import MemoryStore
from sessiond.notify import Notices
from sessiond.otel import Traces
from sessiond.replies import Reloaded, Synced
from sessiond.runs.secrets import known as known_secrets
from sessiond.syscalls.kernel import Kernel
from sessiond.table.sessions import Session, Table
from sessiond.wake.triggers import Triggers
from sessiond.wire import RemoteError, result_of
from tests.inproc.fakes import BOUND, FakeSpawner, Script, false, true


class ManualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock ``advance`` moves forward: the timers the daemon
    set with ``call_later`` fire then, as they would once that time had passed."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = 0.0

    def time(self) -> float:
        return super().time() + self.offset


class Clock:
    """The daemon's wall clock and the loop's, moved together."""

    def __init__(self, loop: ManualLoop) -> None:
        self.loop = loop

    def wall(self) -> float:
        return time.time() + self.loop.offset

    def wall_ns(self) -> int:
        return time.time_ns() + int(self.loop.offset * 1e9)

    def advance(self, seconds: float) -> None:
        self.loop.offset += seconds


class _Writer:
    """What ``Dispatch.handle`` writes an answer to, kept."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def answers(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in bytes(self.data).splitlines() if line.strip()]


@dataclass(frozen=True)
class Parts:
    """What ``build`` wires: the daemon's parts, less its sockets and its spawner."""

    table: Table
    kernel: Kernel
    triggers: Triggers
    control: Dispatch  # the control socket's dispatch table
    program: Dispatch  # the program endpoint's
    notices: Notices
    traces: Traces


def build(config: DaemonConfig, store: Store, env: dict[str, str], harness: Harness) -> Parts:
    """The parts ``sessiond.daemon.service.Daemon`` wires for one node, wired the
    same way: the one place a change of the kernel's construction touches here."""
    table = Table(config, store)
    table.secret_values = lambda spec: known_secrets(spec, env)
    notices = Notices(config, table, store)

    def triggers_of(kernel: Kernel) -> Triggers:
        return Triggers(kernel, harness.clock.wall, config.watch_step_ms)

    kernel = Kernel(config, table, env, notices=notices, triggers=triggers_of)
    kernel.ctx.spawner = FakeSpawner(harness)  # the one part that is not real
    assert isinstance(kernel.triggers, Triggers)
    triggers: Triggers = kernel.triggers
    table.next_wake_fn = triggers.next_wake
    return Parts(
        table=table,
        kernel=kernel,
        triggers=triggers,
        control=Dispatch(kernel, harness.reload),
        program=Dispatch(kernel, harness.reload),
        notices=notices,
        traces=Traces(config, table),
    )


BASE_CONFIG = 'stop_grace = "2s"\nshutdown_grace = "3s"\n'
NO_PROCESS = 'sandbox = "off"\ncgroup = "off"\n'  # what confines a process: there is none


def with_defaults(config: str) -> str:
    """A test's configuration text with the harness's defaults: a ``[run]`` table of
    its own gets the two keys that confine a process; else one is added."""
    if "[run]\n" in config:
        return BASE_CONFIG + config.replace("[run]\n", "[run]\n" + NO_PROCESS, 1)
    return BASE_CONFIG + config + "\n[run]\n" + NO_PROCESS


class Harness:
    """One in-process daemon on a memory store. ``async with Harness(root):``."""

    def __init__(
        self,
        root: Path,
        config: str = "",
        *,
        store: MemoryStore | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        loop = asyncio.get_event_loop()
        assert isinstance(loop, ManualLoop), "run the test on a ManualLoop (tests/inproc)"
        self.clock = Clock(loop)
        self.scripts: dict[str, Script] = {"true": true, "false": false}
        self.env = env if env is not None else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self.state_dir = root / "state"
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (root / "sessiond.toml").write_text(with_defaults(config))
        self.config = load_config(
            root / "sessiond.toml",
            env={},
            state_dir=self.state_dir,
            socket=root / "sock" / "s.sock",
        )
        self.store = store if store is not None else MemoryStore(clock=self.clock.wall_ns)
        # what the file store keeps beside a log (a spec's parse cache, a git trigger's
        # cursor) goes here; the memory store has no folders of its own
        self.store.sessions_dir = self.state_dir / "sessions"
        parts = build(self.config, self.store, self.env, self)
        self.table, self.kernel, self.triggers = parts.table, parts.kernel, parts.triggers
        self.control, self.program_dispatch = parts.control, parts.program
        self.notices, self.traces = parts.notices, parts.traces
        self.spawner = cast(FakeSpawner, self.kernel.ctx.spawner)
        self._ids = 0

    # --- start and stop, as the daemon's ------------------------------------------

    async def __aenter__(self) -> Harness:
        """``Daemon.start``'s steps, less what only processes and files have (the
        lock, leftovers, cgroups, the spawner process, the sockets). Its own
        ``resume`` and ``sync_specs`` are called on this harness, which has the
        attributes they use: the start-up decides as the daemon's does."""
        mask_key(self.config)
        await self.table.load()
        self.notices.start()
        self.traces.start()
        cut_off = await self.kernel.runs.recover_cut_off_runs()
        await self.kernel.handover.recover()
        if self.config.specs is not None:
            await self.sync_specs()
        self.triggers.arm_all()
        names = {s.name for s in cut_off}
        for s in self.table:
            Daemon.resume(cast(Daemon, self), s, cut_off=s.name in names)
        self.kernel.handover.resume()
        self.kernel.retention.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """``Daemon.stop``'s steps for these parts: runs stopped and recorded, logs closed."""
        self.kernel.shut()
        await self.kernel.retention.aclose()
        running = [s for s in self.table if s.run is not None]
        await asyncio.gather(*(self.kernel.stop_run(s, "shutdown") for s in running))
        await self.spawner.close()
        await self.triggers.close()
        await self.notices.close()
        await self.traces.close()
        await self.table.close()

    async def sync_specs(self) -> Synced:
        return await Daemon.sync_specs(cast(Daemon, self))

    async def reload(self) -> Reloaded:
        """``sessionctl reload`` with the configuration unchanged: the spec folder."""
        self.kernel.retention.start()
        return {**await self.sync_specs(), "notes": []}

    # --- programs -----------------------------------------------------------------

    def program(self, name: str) -> Callable[[Script], Script]:
        """``@h.program("hello")``: the script a spec's ``exec = ["true", "hello"]``
        runs (``true``: a real program, so the start's checks pass as they would)."""

        def register(script: Script) -> Script:
            self.scripts[name] = script
            return script

        return register

    def script_for(self, argv: list[str]) -> Script:
        for arg in argv[1:]:
            if arg in self.scripts:
                return self.scripts[arg]
        return self.scripts.get(Path(argv[0]).name, true)

    # --- requests -----------------------------------------------------------------

    async def request(
        self,
        method: str,
        params: dict[str, Any],
        *,
        endpoint: str = "control",
        token: str | None = None,
    ) -> Any:
        """One request line through the endpoint's dispatch table; the result, or the
        wire's error as ``RemoteError`` (code, message, exit code)."""
        self._ids += 1
        frame: dict[str, Any] = {"id": self._ids, "method": method, "params": params}
        if token is not None:
            frame["token"] = token
        writer = _Writer()
        reader = asyncio.StreamReader()
        reader.feed_eof()
        if endpoint == "program":
            dispatch, caller = self.program_dispatch, Caller("program", os.getuid())
        else:
            dispatch, caller = self.control, Caller("control", os.getuid())
        await dispatch.handle(
            orjson.dumps(frame), Frames(reader, 1 << 20), cast(Any, writer), caller
        )
        answers = writer.answers()
        assert answers, f"{method}: no answer"
        return result_of(cast(Any, answers[0]))  # a frame as read back from the wire

    async def call(self, method: str, **params: Any) -> Any:
        """``sessionctl``'s request for ``method`` (on the control socket)."""
        return await self.request(method, params)

    async def refused(self, method: str, **params: Any) -> RemoteError:
        """The error a request is answered with (it must fail)."""
        try:
            result = await self.call(method, **params)
        except RemoteError as exc:
            return exc
        raise AssertionError(f"{method} {params} was not refused: {result!r}")

    async def create(self, text: str, name: str = "spec") -> Any:
        """``sessionctl create FILE``: the spec as its text, as if from ``root/NAME.toml``
        (relative paths in it are the root's)."""
        source = str(self.root / f"{name}.toml")
        return await self.call("create", spec=text, base=str(self.root), source=source)

    async def log(self, name: str, **params: Any) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.call("log", name=name, **params)
        return result

    async def messages(self, name: str) -> list[dict[str, Any]]:
        """``sessionctl replay NAME --view messages --json``: every page, as the
        client reads them."""
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"name": name, "view": "messages", "cursor": None}
        while True:
            page = await self.call("replay", **params)
            items += page["messages"]
            if page["next_cursor"] is None:
                return items
            params.update(cursor=page["next_cursor"], upto=page["upto"])

    async def types(self, name: str) -> list[str]:
        return [r["type"] for r in await self.log(name)]

    # --- waiting ------------------------------------------------------------------

    async def event(
        self,
        name: str,
        etype: str,
        match: Callable[[Record], bool] | None = None,
        *,
        after: int = 0,
    ) -> Record:
        """The first event of ``etype`` in ``name``'s log after seq ``after`` (and
        ``match``), whether it is there already or is appended later."""
        found: asyncio.Future[Record] = asyncio.get_running_loop().create_future()

        def fits(record: Record) -> bool:
            return (
                record["type"] == etype
                and record["seq"] > after
                and (match is None or match(record))
            )

        def listener(session: str, record: Record) -> None:
            if session == name and fits(record) and not found.done():
                found.set_result(record)

        stop = self.table.listen(listener)
        try:
            with contextlib.suppress(Exception):
                for record in self.store.read(name, since=after + 1):
                    if fits(record):
                        return record
            return await asyncio.wait_for(found, BOUND)
        finally:
            stop()

    async def until(self, check: Callable[[], bool]) -> None:
        """Wait until ``check()`` holds: looked at again after every event appended."""
        if check():
            return
        changed = asyncio.Event()
        stop = self.table.listen(lambda _s, _r: changed.set())
        try:
            async with asyncio.timeout(BOUND):
                while not check():
                    changed.clear()
                    await changed.wait()
        finally:
            stop()

    async def idle(self) -> None:
        """Until nothing is left to do (arq's burst): every background task and every
        run has ended. A run that never ends by itself is waited on with ``event``."""
        async with asyncio.timeout(BOUND):
            while True:
                for _ in range(3):
                    await asyncio.sleep(0)
                busy: set[asyncio.Future[Any]] = {
                    t for t in self.kernel.ctx.background if not t.done()
                }
                busy |= {
                    s.run.task
                    for s in self.table
                    if s.run is not None and s.run.task is not None and not s.run.task.done()
                }
                if not busy:
                    return
                await asyncio.wait(busy)

    async def settle(self, check: Callable[[], bool]) -> None:
        """Until ``check()`` holds: whenever nothing is left to do but a retry's
        backoff, the clock moves on to it (the daemon's waits cost no real time)."""
        for _ in range(1000):
            await self.idle()
            if check():
                return
            loop = self.clock.loop
            due = [t.when() for t in self.kernel.ctx.retry_timers.values() if not t.cancelled()]
            if due:
                self.clock.advance(max(min(due) - loop.time(), 0.0) + 0.001)
            else:
                await self.until(check)
        raise AssertionError("the check never held")

    async def advance(self, seconds: float) -> None:
        """Move the clocks forward; what was due by then fires; then ``idle``."""
        self.clock.advance(seconds)
        await self.idle()

    def session(self, name: str) -> Session:
        return self.table.get(name)


def run_on_manual_loop(main: Callable[[], Awaitable[None]]) -> None:
    """Run a test's coroutine on a fresh ``ManualLoop`` and close it after."""
    loop = ManualLoop()
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main())
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
