"""A scripted OpenAI Responses endpoint on loopback (``POST /v1/responses``,
streamed), for running the real Codex CLI offline before the gateway is in front
of it. Each POST gets the next turn of the script: messages and function calls.

    with Endpoint([Turn(shell("echo hi")), Turn(say("done"))]) as ep:
        env["OPENAI_BASE_URL"] = ep.url + "/v1"
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


def say(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def shell(cmd: str) -> dict[str, Any]:
    """A call of Codex's shell tool (``exec_command``; its hooks name it Bash)."""
    return {
        "type": "function_call",
        "name": "exec_command",
        "call_id": f"call_stub{next(_ids):04d}",
        "arguments": json.dumps({"cmd": cmd}),
        "status": "completed",
    }


@dataclass
class Turn:
    items: list[dict[str, Any]]
    held: threading.Event | None = None

    def __init__(self, *items: dict[str, Any], held: threading.Event | None = None) -> None:
        self.items = list(items)
        self.held = held


def _sse(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass
class Endpoint:
    script: list[Turn]
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with endpoint._lock:
                    endpoint.requests.append(body)
                    n = len(endpoint.requests)
                turn = endpoint.script[n - 1] if n <= len(endpoint.script) else Turn(say("?"))
                if turn.held is not None:
                    turn.held.wait(600)
                rid = f"resp_stub{n:04d}"
                out = [dict(item, id=f"item_{n}_{k}") for k, item in enumerate(turn.items)]
                usage = {
                    "input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 120,
                }  # fmt: skip
                head = {"id": rid, "object": "response", "status": "in_progress", "output": []}
                chunks = [_sse({"type": "response.created", "response": head})]
                for k, item in enumerate(out):
                    chunks.append(_sse({"type": "response.output_item.added", "output_index": k,
                                        "item": item}))  # fmt: skip
                    chunks.append(_sse({"type": "response.output_item.done", "output_index": k,
                                        "item": item}))  # fmt: skip
                done = dict(head, status="completed", output=out, usage=usage)
                chunks.append(_sse({"type": "response.completed", "response": done}))
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
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
