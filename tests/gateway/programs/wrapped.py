"""A run's program that wraps official clients' model calls in the SDK's
``run.model_call``, the way a program keeps a model call durable.

``plan.json`` (in its working folder): ``{"api": "messages" | "chat", "texts": [...],
"order": "inside" | "before", "crash": bool, "hold": bool, "base_url": str}``.
Each text is one call; ``inside`` makes the call in the step's ``fn``, ``before``
makes it first and hands the response to the step. With ``crash``, the first run
kills itself (SIGKILL) in the first step's ``fn``, once the gateway answered (its
record is in) and before the step's end; with ``hold``, it waits there for
``go.now`` instead (the daemon is killed meanwhile). ``base_url``: call that
address (an upstream, no gateway) with a key of its own. Each call's usage as the
step returned it is a JSON line in ``results.jsonl``; then the run completes.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import time
from typing import Any

import anthropic
import openai

from sessiond.sdk import connect, connect_async

plan = json.loads(pathlib.Path("plan.json").read_text())
first = not pathlib.Path("crashed.once").exists()
base = plan.get("base_url")
direct: dict[str, Any] = {"base_url": base, "api_key": "sk-own-key"} if base else {}


def ask(text: str) -> tuple[str, dict[str, Any], Any]:
    """A request and the function sending it with the official client."""
    if plan["api"] == "messages":
        req: dict[str, Any] = {"model": "claude-test", "max_tokens": 20,
                               "messages": [{"role": "user", "content": text}]}  # fmt: skip
        client: Any = anthropic.Anthropic(max_retries=0, **direct)
        return req["model"], req, lambda: client.messages.create(**req)
    req = {"model": "gpt-test", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}
    client = openai.OpenAI(max_retries=0, **direct)
    return req["model"], req, lambda: client.chat.completions.create(**req)


def cut(send: Any) -> Any:
    """The first run's first step: the call is answered (and recorded by the gateway),
    then the program dies before its step's end, or waits for its daemon's kill."""
    response = send()
    pathlib.Path("crashed.once").touch()
    if plan.get("hold"):
        pathlib.Path("held.now").touch()
        while not pathlib.Path("go.now").exists():  # (the test kills the daemon meanwhile)
            time.sleep(0.05)
        return response
    os.kill(os.getpid(), signal.SIGKILL)
    return response


async def at_once() -> None:
    """``"async": true``: the calls at once (``asyncio.gather``) with the async clients."""
    async with connect_async() as run:
        client = anthropic.AsyncAnthropic(max_retries=0)

        def send(text: str) -> Any:
            req: dict[str, Any] = {"model": "claude-test", "max_tokens": 20,
                                   "messages": [{"role": "user", "content": text}]}  # fmt: skip
            return run.model_call("claude-test", req, lambda: client.messages.create(**req))

        got = await asyncio.gather(*(send(text) for text in plan["texts"]))
        with open("results.jsonl", "a") as out:
            for one in got:
                out.write(json.dumps({"id": one.get("id"), "usage": one.get("usage")}) + "\n")
        await run.complete("done")


if plan.get("async"):
    asyncio.run(at_once())
    raise SystemExit(0)

with connect() as run:
    for i, text in enumerate(plan["texts"]):
        model, req, send = ask(text)
        if plan.get("crash") and first and i == 0:
            got = run.model_call(model, req, lambda: cut(send))  # noqa: B023 (called at once)
        elif plan.get("order") == "before":
            response = send()  # made first, then handed to the step
            got = run.model_call(model, req, lambda: response)  # noqa: B023 (called at once)
        else:
            got = run.model_call(model, req, send)
        with open("results.jsonl", "a") as out:
            out.write(json.dumps({"id": got.get("id"), "usage": got.get("usage")}) + "\n")
    run.complete("done")
