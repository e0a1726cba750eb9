"""Projections: views computed from the log, never stored as the only copy.

* the messages view — what a model would see: the goal, user and received
  messages, model responses, observations (never raw tool output), and
  compaction summaries in place of the ranges they replaced. Built from the
  log on demand, a page at a time (:func:`messages_page`): the state keeps only
  the summaries in force and the newest few items, so a session's memory does
  not grow with its log.
* :func:`trace` — a timeline a person can read, one event a line.

An item of the view is first a *transcript item* (``seq``, ``role``, ``kind``,
``text`` and, where they apply, ``sender``, ``tool``, ``call``, ``model``,
``artifacts``, ``range``): the form a ``[compact] exec`` program is given. A
*message* (:func:`message`) is what the view shows of it, with ``content``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import cast

from sessiond.describe import describe
from sessiond.log.event_records import (
    EventRecord,
    MessageReceivedData,
    ModelRespondedData,
    ObservationProjectedData,
    SessionMergedData,
    VerificationFinishedData,
)
from sessiond.log.events import CURRENT_VERSION, upcast
from sessiond.log.pace import Pacer
from sessiond.log.records import SummaryRecord
from sessiond.log.replay import replay_all
from sessiond.log.state import State
from sessiond.sdkwire import Message, TranscriptItem

# Items a page of the messages view holds when the caller names no limit, and at most.
PAGE_DEFAULT = 1000
PAGE_MAX = 10_000

_VIEW_TYPES = frozenset(
    {
        "message.received",
        "session.merged",
        "model.responded",
        "observation.projected",
        "verification.finished",
    }
)


def transcript_item(record: EventRecord) -> TranscriptItem | None:
    """The item an event adds to the messages view, or None. The fold
    (:mod:`sessiond.log.replay`) keeps the newest few of the same items."""
    etype = record["type"]
    if etype not in _VIEW_TYPES:
        return None
    if record["v"] != CURRENT_VERSION[etype]:
        record = upcast(record)
    data, seq = record["data"], record["seq"]
    # each payload as the TypedDict of its type (the casts cost nothing at run time)
    if etype == "message.received":
        d = cast(MessageReceivedData, data)
        return {"seq": seq, "role": d["role"], "kind": "message", "text": d["text"],
                "sender": d["sender"]}  # fmt: skip
    if etype == "observation.projected":
        o = cast(ObservationProjectedData, data)
        return {"seq": seq, "role": "tool", "kind": "observation", "text": o["text"],
                "tool": o["tool"], "call": o["call"]}  # fmt: skip
    if etype == "model.responded":
        m = cast(ModelRespondedData, data)
        if not m["text"]:
            return None
        return {"seq": seq, "role": "assistant", "kind": "model", "text": m["text"],
                "model": m["model"]}  # fmt: skip
    if etype == "session.merged":
        g = cast(SessionMergedData, data)
        text = f"[merged from {g['child']}] {g['summary']}"
        return {"seq": seq, "role": "user", "kind": "merge", "text": text, "sender": g["child"],
                "artifacts": g["artifacts"]}  # fmt: skip
    v = cast(VerificationFinishedData, data)
    verdict = "passed" if v["ok"] else "failed"
    return {"seq": seq, "role": "tool", "kind": "verification",
            "text": f"verification {v['check']!r} {verdict}"}  # fmt: skip


def summary_item(summary: SummaryRecord) -> TranscriptItem:
    """A summary in force (``State.summaries``) as a transcript item."""
    return cast(TranscriptItem, {k: v for k, v in summary.items() if k != "hides"})


def hidden(seq: int, summaries: Sequence[SummaryRecord]) -> bool:
    """Is the item at ``seq`` replaced by a summary in force?"""
    return any(s["seq"] <= seq <= s["hides"] for s in summaries)


class ViewScan:
    """The view's items after seq ``after``, fed the log's records (from any seq on)
    in order, with the summaries in force where the records will end
    (``State.summaries`` of the fold up to there)."""

    __slots__ = ("after", "summaries", "waiting")

    def __init__(self, summaries: Sequence[SummaryRecord], after: int = 0) -> None:
        self.after = after
        self.summaries = list(summaries)
        self.waiting = sorted((s for s in summaries if s["seq"] > after), key=lambda s: s["seq"])

    def feed(self, record: EventRecord) -> list[TranscriptItem]:
        seq = record["seq"]
        if seq <= self.after:
            return []
        out = []
        waiting = self.waiting
        while waiting and waiting[0]["seq"] <= seq:
            out.append(summary_item(waiting.pop(0)))
        if record["type"] in _VIEW_TYPES and not (self.summaries and hidden(seq, self.summaries)):
            item = transcript_item(record)
            if item is not None:
                out.append(item)
        return out

    def finish(self) -> list[TranscriptItem]:
        """The summaries placed after the last record fed."""
        out = [summary_item(s) for s in self.waiting]
        self.waiting = []
        return out


def view_items(
    records: Iterable[EventRecord], summaries: Sequence[SummaryRecord], *, after: int = 0
) -> Iterator[TranscriptItem]:
    """The transcript items of the view after seq ``after``, in seq order (see
    :class:`ViewScan`)."""
    scan = ViewScan(summaries, after)
    for record in records:
        yield from scan.feed(record)
    yield from scan.finish()


def goal_message(goal: str) -> list[Message]:
    return (
        [{"role": "system", "kind": "goal", "content": f"Goal: {goal}", "seq": 0}] if goal else []
    )


def message(t: TranscriptItem) -> Message:
    """What the view shows of a transcript item."""
    item: Message = {"role": t["role"], "kind": t["kind"], "content": t["text"], "seq": t["seq"]}
    if "sender" in t:
        item["sender"] = t["sender"]
    if "tool" in t:
        item["tool"] = t["tool"]
    if "model" in t:
        item["model"] = t["model"]
    if "range" in t:
        item["range"] = t["range"]
    return item


def messages(records: Sequence[EventRecord], session: str = "") -> list[Message]:
    """The whole messages view of ``records`` (a session's log from its start), at
    once: for tests and the demo. The daemon pages with :func:`messages_page`."""
    state = replay_all(session, records)
    return goal_message(state.goal) + [message(t) for t in view_items(records, state.summaries)]


async def messages_page(
    records: Iterable[EventRecord],
    state: State,
    *,
    cursor: int | None,
    limit: int,
    pacer: Pacer | None = None,
) -> tuple[list[Message], int | None]:
    """One page of the messages view: up to ``limit`` messages after ``cursor`` (the
    ``next_cursor`` of the page before; None: from the start, the goal first), and
    the cursor of the next page (None: this was the last). ``state`` is the fold of
    the log where ``records`` end; they are read a slice at a time, so the loop
    serves others meanwhile."""
    pacer = pacer or Pacer()
    out = goal_message(state.goal) if cursor is None else []
    if len(out) >= limit:
        return out, 0
    scan = ViewScan(state.summaries, 0 if cursor is None else cursor)
    due = pacer.due
    # Paced per record, not per item: a page's items are few, the events between many.
    for record in records:
        for item in scan.feed(record):
            out.append(message(item))
            if len(out) >= limit:
                return out, item["seq"]
        if due():
            await pacer.pause()
    for item in scan.finish():
        out.append(message(item))
        if len(out) >= limit:
            return out, item["seq"]
    return out, None


def trace(records: Iterable[EventRecord]) -> list[str]:
    """One readable line per event: time, seq, type, summary."""
    return [f"{r['ts']}  {r['seq']:>6}  {r['type']:<22} {describe(r)}".rstrip() for r in records]
