"""What the web console lists of one node's sessions: its process-table rows and
its pending approvals (docs/design.md section 11).

Here, under the web floor, because on a cluster node the console lists the whole
cluster (docs/design.md section 10): each node answers ``web.rows`` and
``web.approvals`` for its own sessions, carried to it like ``ps``
(sessiond.cluster.forward), and the web floor merges the answers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, cast

import orjson

from sessiond.config import DaemonConfig
from sessiond.log.pace import Pacer
from sessiond.replies import ConsoleApproval, ConsoleRow
from sessiond.table.sessions import Session, Table, summary


def node_of(config: DaemonConfig) -> str | None:
    """This daemon's node name on a cluster, None on plain files."""
    return config.cluster.node if config.cluster.dsn is not None else None


def row(table: Table, s: Session, node: str | None = None) -> ConsoleRow:
    """A ``ps`` row with what the console's table also shows: labels, approvals, node."""
    # a ps row made a console row: the keys it lacks are set next
    out = cast(ConsoleRow, summary(s, table.next_wake_fn))
    out["labels"] = dict(s.spec.labels) if s.spec else {}
    out["runnable"] = s.spec is not None and s.spec.run is not None  # activate has a program
    out["pending_approvals"] = (
        len(s.journal.state.pending_approvals()) if s.journal_or_none is not None else 0
    )
    if node is not None:
        out["node"] = node
    return out


async def rows(table: Table, node: str | None) -> list[ConsoleRow]:
    """Every session's row (paced: 10,000 sessions leave the loop free between slices)."""
    out = []
    pacer = Pacer()
    await table.ensure_all()  # a row's approvals are in its log
    for s in sorted(table, key=lambda s: s.name):
        if pacer.due():
            await pacer.pause()
        out.append(row(table, s, node))
    return out


def expires(requested_at: str | None, ttl: float) -> str | None:
    if not requested_at:
        return None
    try:
        when = dt.datetime.fromisoformat(requested_at[:26].rstrip("Z") + "+00:00")
    except ValueError:
        return None
    return (when + dt.timedelta(seconds=ttl)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def approvals(sessions: Iterable[Session], node: str | None = None) -> list[ConsoleApproval]:
    """Every pending approval across sessions, oldest first: the inbox (paced)."""
    items: list[ConsoleApproval] = []
    pacer = Pacer()
    if isinstance(sessions, Table):  # every session's: theirs are in their logs
        await sessions.ensure_all()
    for s in list(sessions):
        if pacer.due():
            await pacer.pause()
        if s.journal_or_none is None or not s.journal.state.approvals:
            continue
        state = s.journal.state
        ttl = s.spec.policy.approval_ttl if s.spec else 3600.0
        for a in state.pending_approvals().values():
            call: Mapping[str, Any] = state.calls.get(a["call"]) or {}  # none: cut off
            item: ConsoleApproval = {
                "session": s.name,
                "agent": (s.spec.agent if s.spec else "") or state.agent,
                "call": a["call"],
                "tool": a["tool"],
                "args": call.get("args", {}),
                "args_json": orjson.dumps(
                    call.get("args", {}), option=orjson.OPT_INDENT_2
                ).decode(),
                "risk": call.get("risk", {}),
                "writes": call.get("writes", []),
                "rule": call.get("rule", ""),
                "requested_at": a.get("requested_at"),
                "expires_at": expires(a.get("requested_at"), ttl),
                "seq": a.get("seq"),
            }
            if node is not None:
                item["node"] = node
            items.append(item)
    items.sort(key=lambda i: (i["requested_at"] or "", i["session"]))
    return items
