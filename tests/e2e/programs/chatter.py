"""A long agent conversation for the retention tests: ``CHAT_CALLS`` model calls,
each re-sending the whole history (as agents do), each message ``CHAT_BYTES`` long.

With ``CHAT_BIG_STEP`` set, a first step returns a result too big to keep in its
event (stored as an artifact, replayed from it). With ``CHAT_ASK`` set, the last
step is ``publish``, which the spec's policy asks a person about: the run stops
there with the turn open, until ``approve``. Every real piece of work appends a
line to ``<work>.count`` in the workspace (each run is a new process).
"""

from __future__ import annotations

import os

from sessiond.sdk import connect


def count(name: str) -> None:
    with open(f"{name}.count", "a") as f:
        f.write("1\n")


def message(i: int, size: int) -> dict[str, str]:
    role = "user" if i % 2 == 0 else "assistant"
    body = f"message {i}: " + "".join(chr(97 + (i * 7 + j) % 26) for j in range(size))
    return {"role": role, "content": body}


def request(n: int, size: int) -> dict[str, object]:
    """What call ``n`` (0-based) sends: the system prompt, then every message so far."""
    history = [message(i, size) for i in range(n + 1)]
    return {"model": "m-test", "system": "be brief", "messages": history, "max_tokens": 64}


def main() -> None:
    calls = int(os.environ.get("CHAT_CALLS", "10"))
    size = int(os.environ.get("CHAT_BYTES", "1000"))
    with connect() as run:
        if os.environ.get("CHAT_BIG_STEP"):

            def big() -> str:
                count("big")
                return "r" * 40_000

            run.step("big", big, side_effect="read", idempotency="safe")
        for n in range(calls):

            def answer(n: int = n) -> dict[str, object]:
                count("model")
                return {"say": f"reply {n}", "usage": {"input_tokens": 10, "output_tokens": 2}}

            run.model_call("m-test", request(n, size), answer)
        if os.environ.get("CHAT_ASK"):
            run.step("publish", lambda: count("publish"))
        run.complete("done talking")


if __name__ == "__main__":
    main()
