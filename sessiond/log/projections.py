"""Projections: views computed from state or events, never stored as the only copy.

* :func:`messages` — what a model would see: the goal, user and received
  messages, model responses, observations (never raw tool output), and
  compaction summaries in place of the ranges they replaced.
* :func:`trace` — a timeline a person can read, one event a line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sessiond.describe import describe
from sessiond.log.state import State


def messages(state: State) -> list[dict[str, Any]]:
    """The messages view. Each item: ``role``, ``kind``, ``content``, ``seq`` and, where
    they apply, ``sender``, ``tool``, ``model``, ``range`` (of a compaction summary)."""
    out: list[dict[str, Any]] = []
    if state.goal:
        out.append({"role": "system", "kind": "goal", "content": f"Goal: {state.goal}", "seq": 0})
    for t in state.transcript:
        item = {"role": t["role"], "kind": t["kind"], "content": t["text"], "seq": t["seq"]}
        for key in ("sender", "tool", "model", "range"):
            if key in t:
                item[key] = t[key]
        out.append(item)
    return out


def trace(records: Iterable[dict[str, Any]]) -> list[str]:
    """One readable line per event: time, seq, type, summary."""
    return [f"{r['ts']}  {r['seq']:>6}  {r['type']:<22} {describe(r)}".rstrip() for r in records]
