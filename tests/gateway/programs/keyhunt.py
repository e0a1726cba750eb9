"""A run's program that hunts for the providers' keys: in its environment, in every
file of /proc it can read (each process's environ, cmdline, and the rest of /proc/
self), and in every file it can read under the folders ``hunt.json`` names (up to 1 MiB each: keys
live in small files).
It knows the keys only by their SHA-256 and a reversed prefix (``hunt.json``), so
it holds none itself. It first calls a model through the gateway (the SDKs, its
environment's address and key), and writes what it found to ``hunt.out.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

import anthropic
import openai

spec = json.loads(pathlib.Path("hunt.json").read_text())
PREFIX = spec["prefix_reversed"][::-1].encode()
KEYS: dict[str, int] = spec["keys"]  # sha256 -> length
LIMIT = 1 << 20
found: list[str] = []
seen = {"files": 0, "proc_files": 0}


def hunt(data: bytes, where: str) -> None:
    at = data.find(PREFIX)
    while at != -1:
        for digest, size in KEYS.items():
            if hashlib.sha256(data[at : at + size]).hexdigest() == digest:
                found.append(where)
        at = data.find(PREFIX, at + 1)


def read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(LIMIT)
    except OSError:
        return None


def main() -> None:
    out: dict[str, Any] = {}
    with anthropic.Anthropic(max_retries=0) as a:
        m = a.messages.create(
            model="claude-test", max_tokens=5, messages=[{"role": "user", "content": "key?"}]
        )
        out["anthropic"] = m.content[0].text  # type: ignore[union-attr]
    with openai.OpenAI(max_retries=0) as o:
        c = o.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "key?"}]
        )
        out["openai"] = c.choices[0].message.content
    for name, value in os.environ.items():
        hunt(f"{name}={value}".encode(), f"env:{name}")
    for root, dirs, files in os.walk("/proc"):
        if root == "/proc":
            dirs[:] = [d for d in dirs if d.isdigit() or d == "self"]
        elif root.count("/") > 3 or "/task" in root:
            dirs[:] = []
        for name in files:
            data = read(os.path.join(root, name)) if name not in ("pagemap", "mem") else None
            if data is not None:
                seen["proc_files"] += 1
                hunt(data, os.path.join(root, name))
    for top in spec["walk"]:
        walk(top)
    out.update(found=sorted(set(found)), **seen)
    pathlib.Path("hunt.out.json").write_text(json.dumps(out))


def walk(top: str) -> None:
    for root, dirs, files in os.walk(top):
        if root == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            data = read(path)
            if data is not None:
                seen["files"] += 1
                hunt(data, path)


if __name__ == "__main__":
    main()
