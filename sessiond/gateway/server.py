"""The model gateway's listeners: loopback TCP, and a Unix socket for sandboxes.

Runs call ``http://127.0.0.1:<port>/run/<session>/<run>`` (``ANTHROPIC_BASE_URL``;
``OPENAI_BASE_URL`` adds ``/v1``) with their run token as the API key. A run whose
sandbox has no network (``network = "none"``) has a loopback of its own: a relay
started in its sandbox (gateway.relay) listens there on the same port and carries
each connection to the gateway's Unix socket, which the sandbox binds in. So the
address is the same inside and out, and a run reaches nothing but the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import structlog
from aiohttp import web

from sessiond.config import DaemonConfig
from sessiond.gateway.budgets import Budgets, TableLedger
from sessiond.gateway.calls import Calls
from sessiond.gateway.door import Door, limit_of
from sessiond.gateway.sched import Scheduler
from sessiond.gateway.view import limits_of
from sessiond.ipc.fence import READ, WRITE, grant
from sessiond.paths import gateway_socket
from sessiond.sandboxconfig import dynamic_uids_on
from sessiond.syscalls.kernel import Kernel

log = structlog.get_logger(__name__)

PREFIX = "/run/{session}/{run}"


def queue_of(config: DaemonConfig) -> Scheduler:
    """The model's queue: limits per provider and model from ``[[model.provider]]``,
    one point of priority for each ``aging`` waited (as the table's scheduler)."""
    return Scheduler(limits_of(config.model.provider), aging=config.aging)


class Gateway:
    """The gateway of one daemon: ``start()`` before any run starts (runs get its
    address), ``close()`` at the end."""

    def __init__(self, kernel: Kernel, scheduler: Scheduler) -> None:
        """``scheduler``: the model's queue, made before the kernel (``queue_of``),
        whose ``models``, ``ps`` and ``show`` read it through a QueueView."""
        self.kernel = kernel
        self.scheduler = scheduler
        table = kernel.ctx.table
        self.budgets = Budgets(
            TableLedger(lambda: table, table.get, lambda: (table.pending, table.pending_spend)),
            lambda: {n: a.budget for n, a in kernel.ctx.config.agents.items()},  # reloads
        )
        self.calls = Calls(kernel, self.scheduler, self.budgets)
        self.socket: Path = gateway_socket(kernel.ctx.config.socket)
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._servers: list[asyncio.Server] = []

    def app(self) -> web.Application:
        # the body's size is checked by the calls (their own error shape)
        app = web.Application(client_max_size=1 << 40)
        for path, api in (
            ("/v1/messages", "messages"),
            ("/v1/chat/completions", "chat"),
            ("/v1/responses", "responses"),
        ):
            app.router.add_post(PREFIX + path, self._route(api))
        return app

    def _route(self, api: str):  # type: ignore[no-untyped-def]
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.calls.handle(request, api)

        return handle

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        config = self.kernel.ctx.config
        host, _, port = config.model.listen.rpartition(":")
        # at the daemon's stop the runs are gone: a call still in flight (an upstream
        # that stalls, a program that never read its stream) is given the stop's
        # grace, not aiohttp's minute, and is then cut as a crash would cut it
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False,
            shutdown_timeout=config.shutdown_grace,
        )  # fmt: skip
        await self._runner.setup()
        # every connection goes through the door: so many at once, a share per uid
        server = self._runner.server
        assert server is not None
        door = Door(server, lambda: server.connections, limit_of(config.max_connections))
        loop = asyncio.get_running_loop()
        tcp = await loop.create_server(
            door.protocol, host.strip("[]"), int(port), reuse_address=True
        )
        self._servers.append(tcp)
        self.port = int(tcp.sockets[0].getsockname()[1])
        # beside the control socket, in the daemon's own folder (which the control
        # server checks as it starts: after this, the runs need the address first)
        self.socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self._servers.append(await loop.create_unix_server(door.protocol, str(self.socket)))
        os.chmod(self.socket, 0o600)
        # as the program endpoint: the [run] user may connect, dynamic uids through the
        # bind in their sandbox (the 0700 folder fences everyone else); the token is
        # what admits a call
        user = config.run.identity()
        if user is not None:
            grant(self.socket, READ | WRITE, {user[0]}, set())
        elif dynamic_uids_on(config):
            os.chmod(self.socket, 0o666)
        self.kernel.ctx.gateway_listens(self.address)
        log.info("gateway.listening", address=self.address, socket=str(self.socket))

    async def close(self) -> None:
        await self.calls.upstreams.close()
        for listening in self._servers:
            listening.close()
        if self._runner is not None:
            await self._runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
