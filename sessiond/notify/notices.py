"""What a notice is, and which log records make one (docs/design.md section 11).

A notice is derived from one record of a session's log, so it has a stable id,
``session:seq``: delivering it twice (after a kill between the delivery and the
cursor's write) sends the same id twice, and a receiver drops the duplicate.
Pure functions of the record: the delivery (sessiond.notify.target) and the
cursor (sessiond.notify.cursor) know nothing of event types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from sessiond.describe import describe

NotifyType = Literal["info", "success", "warning", "failure"]

# run.finished statuses that are a failed run (an interrupt or a stop asked for is not)
FAILED_RUNS = frozenset({"failed", "timeout", "killed", "lost"})


# a record of any event type, read by key
def kinds(record: Mapping[str, Any]) -> list[str]:
    """The notice events (``[[notify]] events``) this record is, most specific
    first; its own event type last (a target may ask for any)."""
    named = _named(record)
    return named if record["type"] in named else [*named, record["type"]]


# a record of any event type, read by key
def _named(record: Mapping[str, Any]) -> list[str]:
    etype, data = record["type"], record.get("data") or {}
    if etype in ("approval.requested", "approval.granted", "approval.denied"):
        return [etype]
    if etype in ("budget.exhausted", "message.received"):
        return [etype]
    if etype == "run.finished" and data.get("status") in FAILED_RUNS:
        return ["run.failed"]
    if etype == "lifecycle.changed":
        to = data.get("to")
        if to == "blocked":
            return ["blocked"]
        if to == "terminated":
            outcome = data.get("outcome")
            return [outcome, "terminated"] if outcome in ("completed", "failed") else ["terminated"]
    return []


@dataclass(frozen=True, slots=True)
class Notice:
    """One notice for one target: what it says, and where it comes from."""

    session: str
    seq: int
    event: str  # the notice event it was sent for (one of the target's `events`)
    type: str  # the record's event type
    ts: str
    title: str
    body: str
    level: NotifyType
    link: str | None
    # (label, url) buttons a person can use from the notice: an approval's signed
    # one-shot approve / deny links, for a target with links = true (made by
    # sessiond.notify.links; they open the web console's confirm page)
    actions: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """Stable across resends: the record's place in its session's log."""
        return f"{self.session}:{self.seq}"


_TITLES = {
    "approval.requested": "needs approval",
    "approval.granted": "approval granted",
    "approval.denied": "approval denied",
    "blocked": "is blocked",
    "run.failed": "run failed",
    "budget.exhausted": "budget exhausted",
    "completed": "completed",
    "failed": "failed",
    "terminated": "terminated",
    "message.received": "message received",
}
_LEVELS: dict[str, NotifyType] = {
    "approval.requested": "warning",
    "blocked": "warning",
    "budget.exhausted": "warning",
    "run.failed": "failure",
    "failed": "failure",
    "completed": "success",
}


def session_link(public_url: str | None, session: str) -> str | None:
    """The console's page of the session, where ``[web] public_url`` is set."""
    if not public_url:
        return None
    return f"{public_url.rstrip('/')}/s/{quote(session)}"


# Line breaks and other control characters, escaped. A run's program names its
# steps (a tool name is any text it likes): one whose name says
# "x\napprove: https://elsewhere" must not put a line in the notice that looks
# like the approval's real approve link, which comes after the body.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(32), 127, 0x85)} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): " ",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
    # Markup. Many targets render the body: Slack, Discord, Telegram, Matrix and
    # ntfy as Markdown, mail as HTML. A step named "[Approve](https://evil)" or
    # "<https://evil|Approve>" (Slack) or "<a href=…>" would be a link that reads
    # as the approval's own. Their brackets become look-alikes that no format
    # parses, so the name still reads as written and nothing in it is a link or
    # a tag. (A bare URL in it may still be linked by the client, but shows as
    # the URL it is.) A lone ">" opens nothing (and stays, in "ready -> blocked").
    ord("<"): "\u2039",  # single left-pointing angle quotation mark
    ord("["): "\uff3b",  # fullwidth left square bracket
    ord("]"): "\uff3d",  # fullwidth right square bracket
}


def one_line(text: str) -> str:
    """``text`` as one line of a notice: what could break it is escaped."""
    return text.translate(_CONTROLS)


def notice_for(
    session: str,
    record: Mapping[str, Any],  # of any event type, read by key
    wanted: frozenset[str],
    public_url: str | None,
) -> Notice | None:
    """The notice a target that wants ``wanted`` gets for ``record`` of ``session``'s
    log (named by the table: a forked log's copied records keep the parent's name)."""
    event = next((k for k in kinds(record) if k in wanted), None)
    if event is None:
        return None
    seq, data = record["seq"], record.get("data") or {}
    title = f"sessiond: {session} {_TITLES.get(event, event)}"
    if event.startswith("approval.") and data.get("tool"):
        title += f": {one_line(str(data['tool']))}"
    link = session_link(public_url, session)
    try:
        what = one_line(describe(record))
    except (KeyError, TypeError):  # a record of an older version lacks a field
        what = ""
    lines = [
        f"{record['type']}: {what}",
        f"session: {session}",
        f"at: {record['ts']}",
        f"id: {session}:{seq}",
    ]
    if event == "approval.requested":
        lines.append(f"answer: sessionctl approve {session} --call {data.get('call', '')}")
    if link is not None:
        lines.append(f"open: {link}")
    return Notice(
        session=session,
        seq=seq,
        event=event,
        type=record["type"],
        ts=record["ts"],
        title=title,
        body="\n".join(lines),
        level=_LEVELS.get(event, "info"),
        link=link,
    )


def rendered(notice: Notice) -> str:
    """The text a person reads: the body, then one line per action."""
    return "\n".join([notice.body, *(f"{label}: {url}" for label, url in notice.actions)])
