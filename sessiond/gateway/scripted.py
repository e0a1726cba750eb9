"""A scripted model upstream on loopback: the three APIs, streaming and not, offline.

It speaks Anthropic Messages (``POST /v1/messages``), OpenAI Chat Completions
(``POST /v1/chat/completions``) and Responses (``POST /v1/responses``) in the shapes
the official SDKs parse (text, tool calls, stop reasons, usage), answering each
request with the next reply of its script, or, past the script's end, an echo of the
last user text. It counts every request it receives (``GET /_count``), can hold a
reply mid-stream until released (``POST /_release``), and can act out a provider's
limits: at most ``concurrency`` requests at once and ``rpm`` a minute, the rest
answered 429 (or 529, Anthropic's "overloaded") with ``Retry-After``.

The tour (``make run``) and the tests use it in place of a provider::

    python -m sessiond.gateway.scripted --port 8700 [--script replies.json]
        [--concurrency 5] [--rpm 60]

    with Upstream([Reply(text("hi")), Reply(tool("Read", path="a"))]) as up:
        ... up.url ... up.count ... up.release()

A script file is a JSON list of replies: ``{"blocks": [{"type": "text", "text":
"hi"}], "input_tokens": 10, "output_tokens": 2, "stop": null, "status": null,
"hold": false}`` (every key optional).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypedDict

import orjson
from aiohttp import web

from sessiond.gateway.shapes import error_body, events, response_of
from sessiond.replies import JsonObject

ROUTES = {"/v1/messages": "messages", "/v1/chat/completions": "chat", "/v1/responses": "responses"}

_ids = itertools.count(1)


def text(value: str) -> JsonObject:
    return {"type": "text", "text": value}


def tool(name: str, **tool_input: Any) -> JsonObject:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": name, "input": tool_input}


@dataclass
class Reply:
    """One scripted reply: its blocks and usage; ``stop="max_tokens"`` for a cut one;
    ``status`` to answer that HTTP error instead; ``hold`` to stop mid-stream (a
    non-streamed reply: before answering) until :meth:`Upstream.release`."""

    blocks: list[JsonObject] = field(default_factory=list)
    input_tokens: int = 10
    output_tokens: int = 5
    stop: str | None = None
    status: int | None = None
    hold: bool = False

    @classmethod
    def of(cls, *blocks: JsonObject, **kw: Any) -> Reply:
        return cls(list(blocks), **kw)


def _last_user_text(api: str, body: JsonObject) -> str:
    if api == "responses":
        given = body.get("input")
        if isinstance(given, str):
            return given
        items = given if isinstance(given, list) else []
    else:
        messages = body.get("messages")
        items = messages if isinstance(messages, list) else []
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
                )
    return ""


class Scripted:
    """The upstream's state and its aiohttp application."""

    def __init__(
        self,
        script: list[Reply] | None = None,
        *,
        concurrency: int | None = None,
        rpm: int | None = None,
        limit_status: int = 429,
        retry_after: float = 1.0,
    ) -> None:
        self.script = deque(script or [])
        self.concurrency, self.rpm = concurrency, rpm
        self.limit_status, self.retry_after = limit_status, retry_after
        self.count = 0  # every model request received, throttled ones too
        self.served = 0
        self.throttled = 0
        self.active = 0
        self.max_active = 0
        self.requests: list[tuple[str, JsonObject]] = []
        self.keys: list[str] = []  # the API key each request carried (x-api-key, Bearer)
        self._minute: deque[float] = deque()
        self._released = asyncio.Event()
        self.changed = threading.Condition()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/_count", self._count)
        app.router.add_post("/_release", self._release)
        app.router.add_route("HEAD", "/", self._head)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        for path in ROUTES:
            app.router.add_post(path, self._model)
        return app

    def release(self) -> None:
        """Let every held reply go on (call on the upstream's loop)."""
        self._released.set()

    async def _head(self, _: web.Request) -> web.Response:
        return web.Response()

    async def _count(self, _: web.Request) -> web.Response:
        return web.json_response(self.counts())

    def counts(self) -> dict[str, int]:
        return {
            "requests": self.count,
            "served": self.served,
            "throttled": self.throttled,
            "max_active": self.max_active,
        }

    async def _release(self, _: web.Request) -> web.Response:
        self.release()
        return web.json_response({"released": True})

    async def _count_tokens(self, _: web.Request) -> web.Response:
        return web.json_response({"input_tokens": 10})

    def _note(self, path: str, body: JsonObject) -> None:
        with self.changed:
            self.count += 1
            self.requests.append((path, body))
            self.changed.notify_all()

    def _limited(self) -> bool:
        now = time.monotonic()
        while self._minute and now - self._minute[0] >= 60:
            self._minute.popleft()
        if self.concurrency is not None and self.active >= self.concurrency:
            return True
        return self.rpm is not None and len(self._minute) >= self.rpm

    async def _model(self, request: web.Request) -> web.StreamResponse:
        api = ROUTES[request.path]
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            return web.json_response(
                error_body(api, 400, "the body is not a JSON object"), status=400
            )
        self._note(request.path, body)
        auth = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.keys.append(request.headers.get("x-api-key") or auth)
        if self._limited():
            with self.changed:
                self.throttled += 1
                self.changed.notify_all()
            message = "rate limited by the scripted upstream"
            return web.json_response(
                error_body(api, self.limit_status, message),
                status=self.limit_status,
                headers={"Retry-After": f"{self.retry_after:g}"},
            )
        self._minute.append(time.monotonic())
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            return await self._answer(request, api, body)
        finally:
            self.active -= 1
            with self.changed:
                self.served += 1
                self.changed.notify_all()

    async def _answer(self, request: web.Request, api: str, body: JsonObject) -> web.StreamResponse:
        reply = (
            self.script.popleft()
            if self.script
            else Reply([text(f"echo: {_last_user_text(api, body)}")])
        )
        if reply.status is not None:
            return web.json_response(
                error_body(api, reply.status, f"scripted error {reply.status}"),
                status=reply.status,
                headers={"Retry-After": f"{self.retry_after:g}"} if reply.status >= 429 else {},
            )
        model = str(body.get("model") or "scripted")
        whole = response_of(
            api,
            reply.blocks,
            model=model,
            n=self.count,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            stop=reply.stop,
        )
        if not body.get("stream"):
            if reply.hold:
                await self._released.wait()
            return web.json_response(whole)
        options = body.get("stream_options")
        if api == "chat" and not (isinstance(options, dict) and options.get("include_usage")):
            whole.pop("usage", None)
        out = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await out.prepare(request)
        chunks = events(api, whole)
        half = max(1, len(chunks) // 2) if reply.hold else len(chunks)
        for chunk in chunks[:half]:
            await out.write(chunk)
        if reply.hold:
            await self._released.wait()
        for chunk in chunks[half:]:
            await out.write(chunk)
        await out.write_eof()
        return out


class Upstream:
    """A :class:`Scripted` upstream on its own thread and loop, for tests: ``url`` is its
    base (``http://127.0.0.1:port``)."""

    def __init__(self, script: list[Reply] | None = None, **limits: Any) -> None:
        self.script = script
        self.limits = limits
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.scripted: Scripted | None = None
        self._stop: asyncio.Event | None = None

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self.scripted = Scripted(self.script, **self.limits)
        self._stop = asyncio.Event()
        runner = web.AppRunner(self.scripted.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        await self._stop.wait()
        self.scripted.release()
        await runner.cleanup()

    def __enter__(self) -> Upstream:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the scripted upstream did not start")
        return self

    def __exit__(self, *_: Any) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def count(self) -> int:
        assert self.scripted is not None
        return self.scripted.count

    @property
    def requests(self) -> list[tuple[str, JsonObject]]:
        assert self.scripted is not None
        return list(self.scripted.requests)

    def counts(self) -> dict[str, int]:
        assert self.scripted is not None
        return self.scripted.counts()

    @property
    def keys(self) -> list[str]:
        assert self.scripted is not None
        return list(self.scripted.keys)

    def release(self) -> None:
        assert self.scripted is not None
        self._loop.call_soon_threadsafe(self.scripted.release)

    def add(self, *replies: Reply) -> None:
        assert self.scripted is not None
        self._loop.call_soon_threadsafe(self.scripted.script.extend, replies)

    def wait_count(self, n: int, timeout: float = 60) -> int:
        """Wait until at least ``n`` requests arrived (a condition, not a sleep)."""
        assert self.scripted is not None
        with self.scripted.changed:
            self.scripted.changed.wait_for(lambda: self.count >= n, timeout)
        return self.count


class ScriptItem(TypedDict, total=False):
    """One reply of a script file (``--script``), as :class:`Reply` takes it."""

    blocks: list[JsonObject]
    input_tokens: int
    output_tokens: int
    stop: str | None
    status: int | None
    hold: bool


def _reply(item: ScriptItem) -> Reply:
    return Reply(
        blocks=list(item.get("blocks") or []),
        input_tokens=int(item.get("input_tokens", 10)),
        output_tokens=int(item.get("output_tokens", 5)),
        stop=item.get("stop"),
        status=item.get("status"),
        hold=bool(item.get("hold", False)),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sessiond.gateway.scripted",
        description="a scripted model upstream on loopback",
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--script", help="a JSON file: a list of replies (else: echo)")
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--rpm", type=int)
    parser.add_argument("--limit-status", type=int, default=429, choices=(429, 529))
    args = parser.parse_args(argv)
    script = []
    if args.script:
        with open(args.script, "rb") as f:
            script = [_reply(item) for item in orjson.loads(f.read())]

    async def serve() -> None:
        up = Scripted(
            script, concurrency=args.concurrency, rpm=args.rpm, limit_status=args.limit_status
        )
        runner = web.AppRunner(up.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"scripted upstream on http://{args.host}:{port}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
