"""A run's program that calls models through the gateway with the official SDKs.

``plan.json`` (in its working folder) lists the calls: ``{"api": "messages" | "chat"
| "responses", "stream": bool, "text": str, "model": str}``. Each call's outcome is
a JSON line in ``results.jsonl``: the text, stop reason, usage and tool calls as the
SDK parsed them, or the error the SDK raised. With ``GW_FAIL_ONCE=1`` the first run
exits 1 after its calls (the turn goes on in a later run), leaving ``failed.once``;
a later run sends a step's ``text_again`` where it has one.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import openai


def messages(step: dict[str, Any]) -> dict[str, Any]:
    with anthropic.Anthropic(max_retries=0) as client:
        kw: Any = {
            "model": step.get("model", "claude-test"),
            "max_tokens": 100,
            "messages": [{"role": "user", "content": step.get("text", "hi")}],
        }
        if step.get("tools"):
            kw["tools"] = step["tools"]
        if step.get("stream"):
            with client.messages.stream(**kw) as s:
                m = s.get_final_message()
        else:
            m = client.messages.create(**kw)
    return {
        "text": "".join(b.text for b in m.content if b.type == "text"),
        "stop": m.stop_reason,
        "usage": [m.usage.input_tokens, m.usage.output_tokens],
        "tools": [[b.name, b.input] for b in m.content if b.type == "tool_use"],
    }


def chat(step: dict[str, Any]) -> dict[str, Any]:
    with openai.OpenAI(max_retries=0) as client:
        kw: Any = {
            "model": step.get("model", "gpt-test"),
            "messages": [{"role": "user", "content": step.get("text", "hi")}],
        }
        if not step.get("stream"):
            c = client.chat.completions.create(**kw)
            msg = c.choices[0].message
            return {
                "text": msg.content or "",
                "stop": c.choices[0].finish_reason,
                "usage": [c.usage.prompt_tokens, c.usage.completion_tokens] if c.usage else None,
                "tools": [
                    [t.function.name, json.loads(t.function.arguments)]
                    for t in msg.tool_calls or []
                    if t.type == "function"
                ],
            }
        chunks = list(
            client.chat.completions.create(
                **kw, stream=True, stream_options={"include_usage": True}
            )
        )
    text, stop = "", None
    tools: dict[int, list[str]] = {}
    for ch in chunks:
        for choice in ch.choices:
            text += choice.delta.content or ""
            stop = choice.finish_reason or stop
            for t in choice.delta.tool_calls or []:
                slot = tools.setdefault(t.index, ["", ""])
                slot[0] += (t.function.name or "") if t.function else ""
                slot[1] += (t.function.arguments or "") if t.function else ""
    usage = chunks[-1].usage
    return {
        "text": text,
        "stop": stop,
        "usage": [usage.prompt_tokens, usage.completion_tokens] if usage else None,
        "tools": [[n, json.loads(a)] for n, a in tools.values()],
    }


def responses(step: dict[str, Any]) -> dict[str, Any]:
    with openai.OpenAI(max_retries=0) as client:
        kw: Any = {"model": step.get("model", "gpt-test"), "input": step.get("text", "hi")}
        if step.get("stream"):
            with client.responses.stream(**kw) as s:
                r = s.get_final_response()
        else:
            r = client.responses.create(**kw)
    return {
        "text": r.output_text,
        "stop": r.status,
        "usage": [r.usage.input_tokens, r.usage.output_tokens] if r.usage else None,
        "tools": [[o.name, json.loads(o.arguments)] for o in r.output if o.type == "function_call"],
    }


def one(step: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"api": step["api"], **globals()[step["api"]](step)}
    except (anthropic.APIStatusError, openai.APIStatusError) as exc:
        return {"api": step["api"], "error": exc.status_code, "body": exc.body}


def main() -> None:
    plan = json.loads(pathlib.Path("plan.json").read_text())
    steps = plan["calls"] if isinstance(plan, dict) else plan
    again = pathlib.Path("failed.once").exists()
    if again:  # a later run: its requests may differ
        steps = [{**step, "text": step.get("text_again", step.get("text"))} for step in steps]
        if isinstance(plan, dict) and plan.get("reverse_again"):
            steps.reverse()
    parallel = isinstance(plan, dict) and plan.get("parallel_first") and not again
    with open("results.jsonl", "a") as out:
        if parallel:  # all at once, as asyncio.gather or threads send them
            with ThreadPoolExecutor(len(steps)) as pool:
                out.writelines(json.dumps(r) + "\n" for r in pool.map(one, steps))
        else:
            for step in steps:  # each written as it comes: a crash keeps what was done
                out.write(json.dumps(one(step)) + "\n")
                out.flush()
    if os.environ.get("GW_FAIL_ONCE") and not pathlib.Path("failed.once").exists():
        pathlib.Path("failed.once").touch()
        sys.exit(1)


if __name__ == "__main__":
    main()
