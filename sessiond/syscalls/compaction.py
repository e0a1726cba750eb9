"""Compaction: replace older context by a summary; the log keeps every original.

The built-in summary is extractive: the first sentence of each replaced message,
with its role. A spec's ``[compact] exec`` program gets the messages to
compact as JSON on stdin and prints the summary on stdout instead. That command
is named by the session's spec and may be in its workspace, which its program
writes: it runs like the program (sessiond.runs.commands), never as the daemon,
and without the session's lock held (``plan``, then the command, then
``still_valid`` and the record), so a command that calls back into the daemon
holds up nothing of the session.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from sessiond.errors import InvalidInput, Refused
from sessiond.log.event_data import ContextCompacted
from sessiond.log.pace import batches
from sessiond.log.projections import ViewScan
from sessiond.runs.commands import CommandNotStarted, run_for_session
from sessiond.runs.start import Starter
from sessiond.sdkwire import TranscriptItem
from sessiond.table.sessions import Session

SUMMARY_LIMIT = 4000
COMMAND_TIMEOUT = 60.0  # [compact] timeout's default
OUTPUT_LIMIT = 64 * 1024  # bytes of stdout a compaction command may print; more: refused
_SENTENCE = re.compile(r"^(.{1,200}?[.!?])(\s|$)", re.S)


def extractive_summary(items: list[TranscriptItem]) -> str:
    parts = []
    for item in items:
        text = " ".join(str(item["text"]).split())
        m = _SENTENCE.match(text)
        first = m.group(1) if m else text[:200]
        who = item.get("sender") or item.get("tool") or item["role"]
        parts.append(f"{who}: {first}")
    summary = " | ".join(parts)
    return summary if len(summary) <= SUMMARY_LIMIT else summary[: SUMMARY_LIMIT - 1] + "…"


async def run_compact_command(
    starter: Starter,
    s: Session,
    planned: Plan,
) -> str:
    """The summary ``[compact] exec`` prints for ``items``. It runs like the
    session's program, never as the daemon (sessiond.runs.commands): confined,
    bounded in time and output, and everything it started stops with it."""
    argv, timeout = planned.command, planned.timeout
    assert argv is not None
    try:
        result = await run_for_session(
            starter,
            s,
            argv,
            purpose="compact",
            cwd=planned.cwd,
            stdin=orjson.dumps(planned.older),
            timeout=timeout,
            max_output=OUTPUT_LIMIT,
        )
    except CommandNotStarted as exc:
        raise Refused(f"the compaction command {exc}") from None
    outcome, name = result.outcome, repr(argv[0])
    if result.over:
        raise Refused(
            f"the compaction command {name} printed more than {OUTPUT_LIMIT} bytes; it was "
            f"stopped. A summary is at most {SUMMARY_LIMIT} characters: print only that"
        )
    if outcome.status == "timeout":
        raise Refused(
            f"the compaction command {name} took more than {timeout:g}s ([compact] "
            "timeout); it was stopped with everything it started"
        )
    if outcome.status != "ok":
        how = (
            f"killed by signal {outcome.signal}"
            if outcome.signal is not None
            else f"exit {outcome.exit_code}"
        )
        raise Refused(
            f"the compaction command {name} failed ({how}): "
            f"{(outcome.error or outcome.stderr.decode(errors='replace')).strip()[:300]}"
        )
    summary = outcome.stdout.decode(errors="replace").strip()
    if not summary:
        raise Refused(f"the compaction command {name} printed no summary")
    return summary[:SUMMARY_LIMIT]


async def view_transcript(session: Session) -> list[TranscriptItem]:
    """The messages view's items as the state stands, from the log (the state keeps
    only the newest few), read a slice at a time so the loop serves others."""
    journal = session.journal
    state = journal.state
    scan = ViewScan(state.summaries)
    items: list[TranscriptItem] = []
    async for batch in batches(journal.read()):
        for record in batch:
            items += scan.feed(record)
    return items + scan.finish()


@dataclass(frozen=True)
class Plan:
    """A compaction as read from the log: the items it replaces."""

    older: list[TranscriptItem]
    command: list[str] | None  # the spec's [compact] exec (None: the built-in summary)
    cwd: str  # the session's workspace ("/" for a session with no [run])
    timeout: float = COMMAND_TIMEOUT

    def event(self, summary: str) -> ContextCompacted:
        return ContextCompacted(
            from_seq=self.older[0]["seq"],
            to_seq=self.older[-1]["seq"],
            summary=summary,
            method="builtin" if self.command is None else "command",
        )


async def plan(session: Session, *, keep: int) -> Plan:
    """What compacting all but the newest ``keep`` messages replaces (the caller
    holds the session's lock)."""
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
        cwd = str(spec.run.cwd) if spec.run is not None else "/"
        return Plan(older, list(spec.compact.exec), cwd, spec.compact.timeout)
    return Plan(older, None, "/")


async def still_valid(session: Session, planned: Plan) -> None:
    """Refused unless the items ``planned`` summarises are still the front of the
    session's context (the caller holds the lock again, after the command ran
    without it). Messages that came meanwhile are after them and stay; another
    compaction or anything that changed those items makes this summary wrong."""
    transcript = await view_transcript(session)
    if transcript[: len(planned.older)] != planned.older:
        raise Refused(
            f"session {session.name!r}'s context changed while its compaction command ran "
            "(another compaction, most likely); nothing was recorded: compact it again"
        )
