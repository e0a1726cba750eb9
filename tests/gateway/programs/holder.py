"""A run's program that shows the test its gateway address and key (``env.json``),
then waits until the test opens ``go`` (a FIFO) for writing, and exits 0."""

from __future__ import annotations

import json
import os
import pathlib

names = ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY")
pathlib.Path("env.tmp").write_text(json.dumps({n: os.environ.get(n) for n in names}))
os.rename("env.tmp", "env.json")
with open("go") as f:  # blocks until the test opens it for writing
    f.read()
