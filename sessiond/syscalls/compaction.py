"""Compaction: replace older context by a summary; the log keeps every original.

The built-in summary is extractive: the first sentence of each replaced message,
with its role. A spec's ``[compact] exec`` program gets the messages to
compact as JSON on stdin and prints the summary on stdout instead.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson

from sessiond.errors import InvalidInput, Refused
from sessiond.log.event_data import ContextCompacted
from sessiond.log.pace import batches
from sessiond.log.projections import ViewScan
from sessiond.table.sessions import Session

SUMMARY_LIMIT = 4000
COMMAND_TIMEOUT = 60.0
_SENTENCE = re.compile(r"^(.{1,200}?[.!?])(\s|$)", re.S)


def extractive_summary(items: list[dict[str, Any]]) -> str:
    parts = []
    for item in items:
        text = " ".join(str(item["text"]).split())
        m = _SENTENCE.match(text)
        first = m.group(1) if m else text[:200]
        who = item.get("sender") or item.get("tool") or item["role"]
        parts.append(f"{who}: {first}")
    summary = " | ".join(parts)
    return summary if len(summary) <= SUMMARY_LIMIT else summary[: SUMMARY_LIMIT - 1] + "…"


async def run_compact_command(argv: list[str], cwd: str, items: list[dict[str, Any]]) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(orjson.dumps(items)), COMMAND_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise Refused(
            f"the compaction command {argv[0]!r} took more than {COMMAND_TIMEOUT:g}s"
        ) from None
    if proc.returncode != 0:
        raise Refused(
            f"the compaction command {argv[0]!r} failed (exit {proc.returncode}): "
            f"{err.decode(errors='replace').strip()[:300]}"
        )
    summary = out.decode(errors="replace").strip()
    if not summary:
        raise Refused(f"the compaction command {argv[0]!r} printed no summary")
    return summary[:SUMMARY_LIMIT]


async def view_transcript(session: Session) -> list[dict[str, Any]]:
    """The messages view's items as the state stands, from the log (the state keeps
    only the newest few), read a slice at a time so the loop serves others."""
    journal = session.j
    state = journal.state
    scan = ViewScan(state.summaries)
    items: list[dict[str, Any]] = []
    async for batch in batches(journal.read()):
        for record in batch:
            items += scan.feed(record)
    return items + scan.finish()


async def compact(session: Session, *, keep: int) -> ContextCompacted:
    """The compaction event for all but the newest ``keep`` messages."""
    if keep < 0:
        raise InvalidInput("--keep must be 0 or more")
    transcript = await view_transcript(session)
    older = transcript[: len(transcript) - keep] if keep else transcript
    # An earlier summary at the front is folded into the new one, not summarised twice.
    if len(older) < 2:
        raise Refused(
            f"session {session.name!r} has {len(transcript)} messages in context; nothing to "
            f"compact while keeping the newest {keep}"
        )
    spec = session.spec
    if spec is not None and spec.compact is not None:
        summary = await run_compact_command(spec.compact.exec, str(spec.workspace), older)
        method = "command"
    else:
        summary = extractive_summary(older)
        method = "builtin"
    return ContextCompacted(
        from_seq=older[0]["seq"],
        to_seq=older[-1]["seq"],
        summary=summary,
        method=method,
    )
