"""One line of text per event, for people: ``sessionctl log`` and the trace view.

On the ground floor because ``sessionctl`` renders log lines itself and must not
import the daemon's packages (its start-up time is part of the contract).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is mypy's: sessionctl does not import it
    from typing import Any

    # An event's payload (its data), as the log holds it: typed per type by its model
    # on the log floor (log/event_data.py), which the clients do not import.
    Payload = Mapping[str, Any]


def _tool(d: Payload) -> str:
    return f"{d['tool']} [{d['call']}]"


def _hashes(h: Mapping[str, str | None]) -> str:
    return ", ".join(f"{p}={(v or 'absent')[:12]}" for p, v in sorted(h.items())) or "no files"


_DESCRIBE: dict[str, Callable[[Payload], str]] = {
    "session.created": lambda d: f"{d['name']}: {d['goal'] or '(no goal)'}",
    "session.forked": lambda d: f"{d['parent']} -> {d['child']} at seq {d['at_seq']}",
    "session.merged": lambda d: f"from {d['child']}: {d['summary']}",
    "session.migrated": lambda d: (
        f"profile {d['from_profile']} -> {d['to_profile']}" if d["to_profile"] else f"to {d['to']}"
    ),
    "session.imported": lambda d: f"from {d['original_name']} ({d['events']} events)",
    "lifecycle.changed": lambda d: (
        f"{d['from'] or '(new)'} -> {d['to']}"
        + (f" ({d['outcome']})" if d["outcome"] else "")
        + (f": {d['reason']}" if d["reason"] else "")
    ),
    "wake.requested": lambda d: f"by {d['trigger']}",
    "gate.evaluated": lambda d: (
        "ok" if d["ok"] else "NOT ok: " + ", ".join(c["name"] for c in d["checks"] if not c["ok"])
    ),
    "recovery.resolved": lambda d: (
        f"--{d['option']}" + (f" [{d['call']}]" if d["call"] else "") + f" by {_who(d)}"
    ),
    "run.started": lambda d: f"run {d['run']} ({d['kind']}, pid {d['pid']})",
    "run.finished": lambda d: (
        f"run {d['run']} {d['status']}{exited(d.get('exit_code'))} in {d['duration_ms']} ms"
    ),
    "message.received": lambda d: f"from {d['sender']}: {d['text'][:80]}",
    "model.requested": lambda d: f"{d['model']} request {d['request_id']}",
    "model.responded": lambda d: (
        f"{d['model']} {d['status']} in={d['tokens_in']} out={d['tokens_out']}"
        + (f" cost=${d['cost_usd']:.4f}" if d.get("cost_usd") is not None else "")
    ),
    "tool.intent": lambda d: f"{_tool(d)} {d['risk']['side_effect']}/{d['risk']['resume']}",
    "policy.decided": lambda d: f"{_tool(d)} {d['decision']}: {_rule(d['rule'])}",
    "approval.requested": _tool,
    "approval.granted": lambda d: f"{_tool(d)} by {_who(d)}",
    "approval.denied": lambda d: f"{_tool(d)} by {_who(d)}: {d['reason']}",
    "tool.started": lambda d: f"{_tool(d)} attempt {d['attempt']} before: {_hashes(d['hashes'])}",
    "tool.finished": lambda d: (
        f"{_tool(d)} {d['status']}{exited(d.get('exit_code'))} after: {_hashes(d['hashes'])}"
    ),
    "observation.projected": lambda d: f"{_tool(d)}: {d['text'][:80]}",
    "context.compacted": lambda d: f"events {d['from_seq']}-{d['to_seq']} ({d['method']})",
    "verification.started": lambda d: d["check"],
    "verification.finished": lambda d: f"{d['check']}: {'ok' if d['ok'] else 'FAILED'}",
    "budget.exhausted": lambda d: f"{d['budget']}: used {d['used']} of {d['limit']}",
    "binding.observed": lambda d: _hashes(d["hashes"]),
    "log.repaired": lambda d: f"dropped {d['dropped_bytes']} bytes after seq {d['last_good_seq']}",
    "spec.applied": lambda d: f"{', '.join(d['changed']) or 'nothing'} changed by {_who(d)}",
    "gc.collected": lambda d: (
        f"removed {len(d['artifacts'])} artifact(s), {len(d['snapshots'])} snapshot(s), "
        f"{d['bytes']} bytes ({d['trigger']})"
    ),
    "migration.started": lambda d: f"hand-over {d['handover'][:8]} to {d['to']}",
    "migration.aborted": lambda d: f"hand-over {d['handover'][:8]} to {d['to']}: {d['reason']}",
    "migration.arriving": lambda d: (
        f"hand-over {d['handover'][:8]} from {d['source']}: held until the source commits"
    ),
    "migration.finished": lambda d: f"hand-over {d['handover'][:8]} finished by {_arbiter(d)}",
    "migration.discarded": lambda d: (
        f"hand-over {d['handover'][:8]} dropped by {_arbiter(d)}: {d['reason']}"
    ),
}


def exited(code: object) -> str:
    """ " exit=1", or "" when there was no exit status (a run never started, or
    killed by a signal before it said)."""
    return "" if code is None else f" exit={code}"


_DEFAULT_RULE = re.compile(r"default: (\S+) (allowed|asks|denied)$")


def _rule(rule: str) -> str:
    """Why the policy decided, in words: "the default for side effect 'none'" (not
    "by default: none allowed", which reads as "nothing is allowed")."""
    found = _DEFAULT_RULE.match(rule)
    if found:
        return f"the default for a tool with side effect {found.group(1)!r}"
    if rule.startswith("default: "):
        return "the default: " + rule.removeprefix("default: ")
    kind, colon, pattern = rule.partition(": ")
    return f"rule {kind} {pattern!r}" if colon else f"rule {rule!r}"


def _arbiter(d: Payload) -> str:
    """Who settled a hand-over: its source, or an operator (who, from the socket)."""
    return "the source" if d["by"] == "source" else _who({**d, "by": ""})


def _who(d: Payload) -> str:
    """Who answered: the user and uid from the socket (events before them: the note)."""
    note = d.get("by") or ""
    if d.get("uid") is None:
        if d.get("channel") == "link" and d.get("user"):  # a notice's signed link
            return f"{d['user']} (a signed link)" + (f", note: {note}" if note else "")
        return note or "an unrecorded person"
    who = f"{d['user']} (uid {d['uid']}, {d['channel']})"
    return f"{who}, note: {note}" if note else who


# a record of any event type, as the log or a remote node gave it (its data per type)
def describe(record: Mapping[str, Any]) -> str:
    """A one-line summary of an event's data."""
    describe_data = _DESCRIBE.get(record["type"])
    return describe_data(record["data"]) if describe_data else ""
