"""The three model APIs' shapes: a whole response as its stream of server-sent events,
a stream assembled back into the whole response, and errors in each provider's shape.

Anthropic Messages (``messages``), OpenAI Chat Completions (``chat``) and OpenAI
Responses (``responses``). The gateway records a streamed call as its assembled
response and, on replay, streams it again with :func:`events`; the scripted upstream
streams its replies with the same function, so what a client parses on replay is what
it parsed the first time. Plain data and pure functions (orjson only).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import orjson

# A provider API's body, block or stream event. Its schema is the provider's and
# changes between their versions (new fields, new block types), so it is read with
# .get and passed on as it came: any JSON object.
ProviderJson = dict[str, Any]

API = str  # "messages" | "chat" | "responses"


# --- errors ----------------------------------------------------------------------------

# an HTTP status -> the error type each provider names it with
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    529: "overloaded_error",
}
_OPENAI_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "model_not_allowed"),
    404: ("invalid_request_error", "model_not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_exceeded", "rate_limit_exceeded"),
    500: ("server_error", None),
    502: ("server_error", None),
    529: ("server_error", "overloaded"),
}


def error_body(api: API, status: int, message: str, code: str | None = None) -> ProviderJson:
    """The body a provider answers an error with: Anthropic's
    ``{"type": "error", "error": {"type", "message"}}``, OpenAI's
    ``{"error": {"message", "type", "param", "code"}}``."""
    if api == "messages":
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind, default = _OPENAI_TYPES.get(status, ("server_error", None))
    return {"error": {"message": message, "type": kind, "param": None, "code": code or default}}


# --- a whole response from neutral blocks (the scripted upstream's replies) --------------


def response_of(
    api: API,
    blocks: list[ProviderJson],
    *,
    model: str,
    n: int,
    input_tokens: int,
    output_tokens: int,
    stop: str | None = None,
) -> ProviderJson:
    """A whole response of ``api`` holding ``blocks`` (``{"type": "text", "text"}`` or
    ``{"type": "tool_use", "id", "name", "input"}``). ``stop``: ``"max_tokens"`` for a
    cut reply, else it follows from the blocks (a tool call or the end of the turn)."""
    tools = [b for b in blocks if b["type"] == "tool_use"]
    if api == "messages":
        return {
            "id": f"msg_{n:08d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop or ("tool_use" if tools else "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    if api == "chat":
        message: ProviderJson = {"role": "assistant", "content": text or None, "refusal": None}
        if tools:
            message["tool_calls"] = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()},
                }
                for b in tools
            ]
        finish = "length" if stop == "max_tokens" else ("tool_calls" if tools else "stop")
        return {
            "id": f"chatcmpl-{n:08d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": input_tokens,
                "completion_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            },
        }
    output: list[ProviderJson] = []
    if text:
        output.append(
            {
                "type": "message",
                "id": f"msg_{n:08d}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for b in tools:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{b['id']}",
                "call_id": b["id"],
                "name": b["name"],
                "arguments": orjson.dumps(b["input"]).decode(),
                "status": "completed",
            }
        )
    cut = stop == "max_tokens"
    return {
        "id": f"resp_{n:08d}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": None,
        "metadata": {},
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }


# --- a whole response as server-sent events --------------------------------------------


def sse(event: str | None, data: ProviderJson | str) -> bytes:
    body = data if isinstance(data, str) else orjson.dumps(data).decode()
    return (f"event: {event}\n" if event else "").encode() + f"data: {body}\n\n".encode()


def events(api: API, response: ProviderJson) -> list[bytes]:
    """``response`` streamed as ``api`` streams it (each item one SSE event)."""
    if api == "messages":
        return list(_messages_events(response))
    if api == "chat":
        return list(_chat_events(response))
    return list(_responses_events(response))


def _messages_events(m: ProviderJson) -> Iterator[bytes]:
    usage = dict(m.get("usage") or {})
    start = {**m, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": min(1, int(usage.get("output_tokens") or 0))}
    yield sse("message_start", {"type": "message_start", "message": start})
    for i, block in enumerate(m.get("content") or []):
        kind = block.get("type")
        if kind == "text":
            first: ProviderJson = {"type": "text", "text": ""}
            delta: ProviderJson = {"type": "text_delta", "text": block.get("text", "")}
        elif kind == "tool_use":
            first = {**block, "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": orjson.dumps(block["input"]).decode(),
            }
        elif kind == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block.get("thinking", "")}
        else:  # a block kind streamed whole (redacted thinking, server tool results)
            first, delta = block, {}
        yield sse(
            "content_block_start",
            {"type": "content_block_start", "index": i, "content_block": first},
        )
        if delta:
            yield sse(
                "content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}
            )
        if kind == "thinking" and block.get("signature"):
            sig = {"type": "signature_delta", "signature": block["signature"]}
            yield sse(
                "content_block_delta", {"type": "content_block_delta", "index": i, "delta": sig}
            )
        yield sse("content_block_stop", {"type": "content_block_stop", "index": i})
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": m.get("stop_reason"), "stop_sequence": m.get("stop_sequence")},
            "usage": {"output_tokens": int(usage.get("output_tokens") or 0)},
        },
    )
    yield sse("message_stop", {"type": "message_stop"})


def _chat_events(c: ProviderJson) -> Iterator[bytes]:
    head: ProviderJson = {k: c[k] for k in ("id", "created", "model") if k in c}
    head["object"] = "chat.completion.chunk"
    for choice in c.get("choices") or []:
        i, message = choice.get("index", 0), choice.get("message") or {}

        def chunk(delta: ProviderJson, finish: str | None = None, i: int = i) -> bytes:
            one = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": None}
            return sse(None, {**head, "choices": [one]})

        yield chunk({"role": "assistant", "content": ""})
        if message.get("content"):
            yield chunk({"content": message["content"]})
        for k, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": k,
                            "id": call.get("id"),
                            "type": "function",
                            "function": {"name": fn.get("name"), "arguments": ""},
                        }
                    ]
                }
            )
            yield chunk(
                {"tool_calls": [{"index": k, "function": {"arguments": fn.get("arguments", "")}}]}
            )
        yield chunk({}, choice.get("finish_reason") or "stop")
    if c.get("usage") is not None:
        yield sse(None, {**head, "choices": [], "usage": c["usage"]})
    yield sse(None, "[DONE]")


def _responses_events(r: ProviderJson) -> Iterator[bytes]:
    seq = iter(range(1 << 30))

    def ev(kind: str, **fields: Any) -> bytes:
        return sse(kind, {"type": kind, "sequence_number": next(seq), **fields})

    begun = {**r, "status": "in_progress", "output": [], "usage": None}
    yield ev("response.created", response=begun)
    yield ev("response.in_progress", response=begun)
    for i, item in enumerate(r.get("output") or []):
        if item.get("type") == "message":
            yield ev(
                "response.output_item.added",
                output_index=i,
                item={**item, "status": "in_progress", "content": []},
            )
            for j, part in enumerate(item.get("content") or []):
                empty = {**part, "text": ""} if part.get("type") == "output_text" else part
                yield ev(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=i,
                    content_index=j,
                    part=empty,
                )
                if part.get("type") == "output_text":
                    yield ev(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=i,
                        content_index=j,
                        delta=part["text"],
                        logprobs=[],
                    )
                    yield ev(
                        "response.output_text.done",
                        item_id=item["id"],
                        output_index=i,
                        content_index=j,
                        text=part["text"],
                        logprobs=[],
                    )
                yield ev(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=i,
                    content_index=j,
                    part=part,
                )
        elif item.get("type") == "function_call":
            yield ev(
                "response.output_item.added",
                output_index=i,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            yield ev(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=i,
                delta=item["arguments"],
            )
            yield ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=i,
                arguments=item["arguments"],
            )
        else:
            yield ev("response.output_item.added", output_index=i, item=item)
        yield ev("response.output_item.done", output_index=i, item=item)
    done = "response.incomplete" if r.get("status") == "incomplete" else "response.completed"
    yield ev(done, response=r)


# --- a stream assembled into its whole response ----------------------------------------


class Assembler:
    """Feeds on the bytes of a stream as they pass and assembles the whole response
    (``result``), for the record: usage, stop reason, text and the replay."""

    def __init__(self, api: API) -> None:
        self.api = api
        self._buffer = b""
        self.result: ProviderJson | None = None
        self.done = False
        self._args: dict[int, str] = {}  # a tool_use block's input, as it streams

    def feed(self, data: bytes) -> None:
        self._buffer += data.replace(b"\r\n", b"\n")
        while b"\n\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n\n", 1)
            lines = [ln[5:].strip() for ln in raw.split(b"\n") if ln.startswith(b"data:")]
            if not lines:
                continue
            payload = b"\n".join(lines)
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                value = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue  # not ours to judge: the client sees the bytes as they came
            if isinstance(value, dict):
                self._event(value)

    def _event(self, e: ProviderJson) -> None:
        if self.api == "messages":
            self._message_event(e)
        elif self.api == "chat":
            self._chat_event(e)
        elif str(e.get("type", "")) in ("response.completed", "response.incomplete"):
            self.result, self.done = e.get("response"), True
        elif e.get("type") == "response.failed":
            self.done = True

    def _message_event(self, e: ProviderJson) -> None:
        kind = e.get("type")
        m = self.result
        if kind == "message_start":
            self.result = {**e.get("message", {}), "content": []}
            return
        if m is None:
            return
        if kind == "content_block_start":
            m["content"].append(dict(e.get("content_block") or {}))
        elif kind == "content_block_delta" and m["content"]:
            i = int(e.get("index", len(m["content"]) - 1))
            block, d = m["content"][min(i, len(m["content"]) - 1)], e.get("delta") or {}
            dk = d.get("type")
            if dk == "text_delta":
                block["text"] = block.get("text", "") + d.get("text", "")
            elif dk == "input_json_delta":
                self._args[i] = self._args.get(i, "") + d.get("partial_json", "")
            elif dk == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + d.get("thinking", "")
            elif dk == "signature_delta":
                block["signature"] = d.get("signature", "")
        elif kind == "content_block_stop":
            i = int(e.get("index", 0))
            if i in self._args and i < len(m["content"]):
                with contextlib.suppress(orjson.JSONDecodeError):
                    m["content"][i]["input"] = orjson.loads(self._args.pop(i) or b"{}")
        elif kind == "message_delta":
            m.update(dict((e.get("delta") or {}).items()))
            m["usage"] = {**(m.get("usage") or {}), **(e.get("usage") or {})}
        elif kind == "message_stop":
            self.done = True

    def _chat_event(self, e: ProviderJson) -> None:
        c = self.result
        if c is None:
            c = self.result = {k: e[k] for k in ("id", "created", "model") if k in e}
            c.update(object="chat.completion", choices=[])
        if e.get("usage") is not None:
            c["usage"] = e["usage"]
        for ch in e.get("choices") or []:
            i = int(ch.get("index", 0))
            while len(c["choices"]) <= i:
                n = len(c["choices"])
                c["choices"].append(
                    {
                        "index": n,
                        "message": {"role": "assistant", "content": None},
                        "finish_reason": None,
                        "logprobs": None,
                    }
                )
            slot, d = c["choices"][i], ch.get("delta") or {}
            msg = slot["message"]
            if d.get("content"):
                msg["content"] = (msg.get("content") or "") + d["content"]
            for tc in d.get("tool_calls") or []:
                calls = msg.setdefault("tool_calls", [])
                k = int(tc.get("index", 0))
                while len(calls) <= k:
                    calls.append(
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                fn = tc.get("function") or {}
                if tc.get("id"):
                    calls[k]["id"] = tc["id"]
                if fn.get("name"):
                    calls[k]["function"]["name"] = fn["name"]
                calls[k]["function"]["arguments"] += fn.get("arguments") or ""
            if ch.get("finish_reason"):
                slot["finish_reason"] = ch["finish_reason"]


# --- what the record keeps of a response -------------------------------------------------


def usage_of(api: API, response: ProviderJson) -> tuple[int, int]:
    """(input tokens, output tokens) as the response reports them."""
    u = response.get("usage") or {}
    if api == "chat":
        return int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    tin = int(u.get("input_tokens") or 0)
    if api == "messages":  # cached input is input too
        tin += int(u.get("cache_read_input_tokens") or 0)
        tin += int(u.get("cache_creation_input_tokens") or 0)
    return tin, int(u.get("output_tokens") or 0)


def stop_of(api: API, response: ProviderJson) -> str | None:
    if api == "messages":
        found = response.get("stop_reason")
    elif api == "chat":
        found = (response.get("choices") or [{}])[0].get("finish_reason")
    else:
        found = response.get("status")
    return str(found) if found is not None else None


def text_of(api: API, response: ProviderJson) -> str:
    """The response's text (what the log shows of it)."""
    if api == "messages":
        return "".join(
            b.get("text", "") for b in response.get("content") or [] if b.get("type") == "text"
        )
    if api == "chat":
        return "".join(
            (c.get("message") or {}).get("content") or "" for c in response.get("choices") or []
        )
    return "".join(
        p.get("text", "")
        for item in response.get("output") or []
        if item.get("type") == "message"
        for p in item.get("content") or []
        if p.get("type") == "output_text"
    )
