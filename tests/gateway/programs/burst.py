"""A run that sends ``BURST_CALLS`` model calls at once (threads), with the official
Anthropic SDK and no retries of its own: what a 429 storm looks like from a program.

Each call asks with the text ``<session>#<k>``; each outcome is a line of
``results.jsonl`` in the working folder: the reply's text, or the error the SDK
raised (its HTTP status), which must never be a 429 while the gateway retries.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import anthropic


def call(client: anthropic.Anthropic, text: str, out: list[dict[str, Any]]) -> None:
    try:
        m = client.messages.create(
            model="claude-test", max_tokens=50, messages=[{"role": "user", "content": text}]
        )
        out.append({"asked": text, "text": "".join(b.text for b in m.content if b.type == "text")})
    except anthropic.APIStatusError as exc:
        out.append({"asked": text, "error": exc.status_code})


def main() -> None:
    session = os.environ["SESSIOND_SESSION"]
    n = int(os.environ.get("BURST_CALLS", "2"))
    results: list[dict[str, Any]] = []
    with anthropic.Anthropic(max_retries=0, timeout=600) as client:
        threads = [
            threading.Thread(target=call, args=(client, f"{session}#{k}", results))
            for k in range(1, n + 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with open("results.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
