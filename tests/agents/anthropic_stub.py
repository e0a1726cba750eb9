"""A scripted Anthropic-compatible endpoint on loopback, for running the real
Claude Code CLI offline in tests.

The CLI sends one ``HEAD /`` and then ``POST /v1/messages?beta=true``, always
streamed. Each POST gets the next turn of the script as a server-sent event
stream: text blocks, tool_use blocks, and the usage. The model is scripted; the
CLI, its stream, its tools and its resume are the real ones.

    with Endpoint([Turn(tool("Read", file_path="a.txt")), Turn(text("done"))]) as ep:
        env["ANTHROPIC_BASE_URL"] = ep.url
        ...
        assert len(ep.requests) == 2
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


_ids = itertools.count(1)


def tool(name: str, **tool_input: Any) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_stub{next(_ids):04d}",
        "name": name,
        "input": tool_input,
    }


@dataclass
class Turn:
    """One model response: its content blocks and the tokens it reports. With
    ``held``, the endpoint answers only once the event is set (the request stays
    open meanwhile: a test can act while the CLI waits for the model)."""

    blocks: list[dict[str, Any]]
    input_tokens: int = 100
    output_tokens: int = 20
    held: threading.Event | None = None

    def __init__(
        self,
        *blocks: dict[str, Any],
        input_tokens: int = 100,
        output_tokens: int = 20,
        held: threading.Event | None = None,
    ):
        self.blocks = list(blocks)
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.held = held


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _events(turn: Turn, model: str, n: int) -> list[bytes]:
    usage = {"input_tokens": turn.input_tokens, "output_tokens": 1}
    stop = "tool_use" if any(b["type"] == "tool_use" for b in turn.blocks) else "end_turn"
    out = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_stub{n:04d}",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            },
        )
    ]
    for i, block in enumerate(turn.blocks):
        start: dict[str, Any]
        delta: dict[str, Any]
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        out.append(
            _sse("content_block_start", {"type": "content_block_start", "index": i,
                                         "content_block": start})
        )  # fmt: skip
        out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                "delta": delta}))  # fmt: skip
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": turn.output_tokens},
            },
        )
    )
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return out


@dataclass
class Endpoint:
    """The scripted endpoint: ``url`` for ANTHROPIC_BASE_URL; ``requests`` holds the
    bodies of the POSTs it answered (in order). A POST past the end of the script
    gets an error response (the CLI runs with CLAUDE_CODE_MAX_RETRIES=0)."""

    script: list[Turn]
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self.changed = threading.Condition(self._lock)
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"{}")
                if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
                    payload = b'{"input_tokens": 10}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                with endpoint._lock:
                    endpoint.requests.append(body)
                    n = endpoint._next
                    endpoint._next += 1
                    endpoint.changed.notify_all()
                if n >= len(endpoint.script):
                    payload = json.dumps({
                        "type": "error",
                        "error": {"type": "invalid_request_error",
                                  "message": f"the test script has no turn {n + 1}"},
                    }).encode()  # fmt: skip
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                turn = endpoint.script[n]
                if turn.held is not None:
                    turn.held.wait(600)  # bounded: __exit__ sets it
                chunks = _events(turn, str(body.get("model", "stub")), n + 1)
                self.close_connection = True
                with contextlib.suppress(OSError):  # the CLI may be gone (a held turn)
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for chunk in chunks:
                        self.wfile.write(chunk)
                    self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Endpoint:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        for turn in self.script:
            if turn.held is not None:
                turn.held.set()
        self._server.shutdown()
        self._server.server_close()

    def extend(self, *turns: Turn) -> None:
        """More turns, for the next wake."""
        with self._lock:
            self.script.extend(turns)
