"""What the console shows, computed from the table and the logs (read-only).

The process table is filtered and cut into pages here, on the server: the
browser never gets the whole table (10,000 sessions make 200 pages of 50).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from sessiond.errors import InvalidInput
from sessiond.log.pace import Pacer
from sessiond.log.projections import ViewScan, goal_message, message
from sessiond.log.state import State
from sessiond.log.store.base import ArtifactStore, Record
from sessiond.replies import ConsoleApproval, ConsoleRow, TablePage
from sessiond.sdkwire import ArtifactJson, Message
from sessiond.syscalls.console import approvals, expires, row
from sessiond.table.sessions import Session, Table
from sessiond.web.humane import actions_for

__all__ = ["approvals", "expires"]  # the inbox's, from the node's own (syscalls.console)

PAGE = 50
MESSAGES_PAGE = 100
STATES = ("created", "ready", "running", "sleeping", "suspended", "blocked", "terminated")


async def table_page(
    table: Table, state: str = "", agent: str = "", label: str = "", page: int = 1
) -> TablePage:
    """One page of the process table, filtered by state, agent and a label (k=v or k).

    The filter walks every session, so it is paced (sessiond.log.pace): with
    10,000 sessions the loop still answers others between slices."""
    if state and state not in STATES:
        raise InvalidInput(f"no state {state!r}; the states are {', '.join(STATES)}")
    key, _, value = label.partition("=")
    names: list[str] = []
    waiting = 0  # the approvals tab's count, from the same walk
    pacer = Pacer()
    await table.ensure_all()  # a row's approvals are in its log
    for s in list(table):  # a copy: sessions may be created while this yields
        if pacer.due():
            await pacer.pause()
        if s.journal_or_none is not None and s.journal.state.approvals:
            waiting += len(s.journal.state.pending_approvals())
        if state and s.state != state:
            continue
        spec = s.spec
        if agent and agent != ((spec.agent if spec else "") or _agent(s)):
            continue
        if key:
            labels = spec.labels if spec else {}
            if key not in labels or (value and labels[key] != value):
                continue
        names.append(s.name)
    names.sort()
    pages = max(1, -(-len(names) // PAGE))
    page = min(max(1, page), pages)
    out = []
    for name in names[(page - 1) * PAGE : page * PAGE]:
        shown = table.sessions.get(name)
        if shown is None:  # gone meanwhile (migrated away)
            continue
        out.append(with_actions(row(table, shown)))
    return {"rows": out, "total": len(names), "page": page, "pages": pages, "size": PAGE,
            "sessions": len(table), "approvals": waiting}  # fmt: skip


def rows_page(
    rows: list[ConsoleRow], state: str = "", agent: str = "", label: str = "", page: int = 1
) -> TablePage:
    """:func:`table_page` of rows already made (the whole cluster's, each with its node)."""
    if state and state not in STATES:
        raise InvalidInput(f"no state {state!r}; the states are {', '.join(STATES)}")
    key, _, value = label.partition("=")
    kept = []
    for r in rows:
        labels = r.get("labels") or {}
        if state and r.get("state") != state:
            continue
        if agent and agent != r.get("agent"):
            continue
        if key and (key not in labels or (value and labels[key] != value)):
            continue
        kept.append(r)
    pages = max(1, -(-len(kept) // PAGE))
    page = min(max(1, page), pages)
    shown = [with_actions(r.copy()) for r in kept[(page - 1) * PAGE : page * PAGE]]
    return {"rows": shown, "total": len(kept), "page": page,
            "pages": pages, "size": PAGE, "sessions": len(rows), "clustered": True,
            "approvals": sum(int(r.get("pending_approvals") or 0) for r in rows)}  # fmt: skip


def with_actions(r: ConsoleRow) -> ConsoleRow:
    """A row with the lifecycle buttons its state offers (the table's per-row actions)."""
    r["actions"] = actions_for(str(r.get("state", "")), bool(r.get("runnable", True)))
    return r


def _agent(s: Session) -> str:
    return s.journal.state.agent if s.journal_or_none is not None else ""


async def find_approval(table: Table, name: str, call: str) -> ConsoleApproval | None:
    """One pending approval (the confirm page's), or None once it is answered."""
    for item in await approvals([table.get(name)]):
        if item["call"] == call:
            return item
    return None


# The events whose data names artifacts (sessiond.log.event_data's ArtifactRef fields).
ARTIFACT_TYPES = [
    "tool.finished",
    "run.finished",
    "model.requested",
    "model.responded",
    "context.compacted",
    "verification.finished",
    "session.merged",
    "spec.applied",
]


class ArtifactSeen(ArtifactJson):
    """An artifact an event names, with where: the event's field, type and seq."""

    field: str
    type: str
    seq: int
    diff: bool  # the field is a diff: the page colours its lines


# records: as the log or another node gave them, an event of any type (read by key)
def artifact_refs(records: Sequence[Mapping[str, Any]]) -> list[ArtifactSeen]:
    """The artifacts a session's events name (newest first), each once, with where."""
    seen: dict[str, ArtifactSeen] = {}
    for r in records:
        for field, value in r["data"].items():
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, dict) and str(ref.get("ref", "")).startswith("sha256:"):
                    # an ArtifactRef as the event wrote it (its model checked it then)
                    seen[ref["ref"]] = cast(ArtifactSeen, {**ref, "field": field,
                        "type": r["type"], "seq": r["seq"], "diff": field == "diff"})  # fmt: skip
    return sorted(seen.values(), key=lambda a: (-a["seq"], a["name"]))


def artifact_text(store: ArtifactStore, ref: str, limit: int = 256 << 10) -> tuple[str, bool]:
    """An artifact as text (cut at ``limit`` bytes), and whether it was cut."""
    data = store.get(ref)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def diff_lines(text: str) -> list[tuple[str, str]]:
    """A unified diff, line by line, with its kind for the page's colours."""
    out = []
    for line in text.splitlines():
        if line.startswith(("+++", "---")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append((kind, line))
    return out


async def messages_before(
    records: Iterable[Record], state: State, before: int | None, limit: int
) -> tuple[list[Message], int | None]:
    """A page of the messages view, newest first: the last ``limit`` messages before
    seq ``before`` (None: the newest), oldest of them first, and the ``before`` of
    the page older than this one (None: this page reaches the goal).

    The paged view of ``replay --view messages`` (sessiond.log.projections) runs
    forward from a cursor; a person reads a session from its end, so this keeps
    the last ``limit`` items of the same scan (its summaries in force, its hidden
    ranges) in one paced pass over ``records`` (the log up to ``before``)."""
    kept: deque[Message] = deque(maxlen=limit)
    older = False

    def keep(item: Message) -> None:
        nonlocal older
        if before is None or item["seq"] < before:
            older = older or len(kept) == limit
            kept.append(item)

    for goal in goal_message(state.goal):
        keep(goal)
    scan = ViewScan(state.summaries)
    pacer = Pacer()
    for record in records:
        for item in scan.feed(record):
            keep(message(item))
        if pacer.due():
            await pacer.pause()
    for item in scan.finish():
        keep(message(item))
    page = list(kept)
    return page, (page[0]["seq"] if older and page else None)
