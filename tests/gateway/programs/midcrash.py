"""A run's program that dies mid-stream the first time (after the first event of
its streamed call) and, in the next run of the turn, makes the same call and
writes the answer's text to ``final.txt``."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import anthropic

first = not pathlib.Path("crashed.once").exists()
with anthropic.Anthropic(max_retries=0) as client:
    ask: Any = {"role": "user", "content": "go"}
    with client.messages.stream(model="claude-test", max_tokens=100, messages=[ask]) as s:
        for _ in s:
            if first:
                pathlib.Path("crashed.once").touch()
                os._exit(1)
        m = s.get_final_message()
pathlib.Path("final.txt").write_text("".join(b.text for b in m.content if b.type == "text"))
