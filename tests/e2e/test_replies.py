"""The reply types (sessiond/replies.py) are what the real daemon answers.

``sessionctl`` and the web console read the syscalls' answers through these
TypedDicts, and mypy checks them against the code that builds each answer; this
checks them against the wire: every key an answer has is declared, every key
its type requires is there, and each value has its declared type (nested
replies too). A reply type that drifted from the JSON the daemon sends fails
here, whichever side moved.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Mapping
from typing import (
    Any,
    Literal,
    NotRequired,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import pytest

from sessiond import replies
from sessiond.codec import EventRecord
from sessiond.listing import PsRequest
from sessiond.wire import Connection
from tests.e2e.harness import Daemon, running, short_dir, wait_event

HELLO = """name = "hello"
goal = "say hello"
agent = "demo"
[run]
exec = ["sh", "-c", "echo hello from $SESSIOND_SESSION"]
cwd = "."
[[trigger]]
type = "message"
"""
ASKS = """name = "asks"
[run]
exec = ["true"]
cwd = "{ws}"
[policy]
ask = ["command"]
"""
NOTES = """name = "notes"
goal = "collect notes"
"""


def problems(value: Any, hint: Any, where: str) -> list[str]:
    """What in ``value`` does not fit ``hint`` (empty: it fits)."""
    if hint is Any or hint is object or _any_json(hint):
        return []  # any JSON (what the daemon sends is JSON by construction)
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object ({hint.__name__})"]
        hints = get_type_hints(hint)
        # (read from the hints: replies.py's annotations are strings, which the
        # TypedDict's own __required_keys__ cannot see NotRequired in)
        marked = get_type_hints(hint, include_extras=True)
        required = [k for k, h in marked.items() if get_origin(h) is not NotRequired]
        out = [f"{where}.{k}: not in {hint.__name__}" for k in value if k not in hints]
        out += [f"{where}.{k}: missing" for k in required if k not in value]
        for k, v in value.items():
            if k in hints:
                out += problems(v, hints[k], f"{where}.{k}")
        return out
    origin = get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        tried = [problems(value, arm, where) for arm in get_args(hint)]
        return [] if any(not t for t in tried) else min(tried, key=len)
    if origin is Literal:
        return [] if value in get_args(hint) else [f"{where}: {value!r} not in {hint}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not a list"]
        (item,) = get_args(hint)
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{where}[{i}]")]
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object"]
        _, item = get_args(hint)
        return [p for k, v in value.items() for p in problems(v, item, f"{where}.{k}")]
    if hint is None or hint is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    if hint is float:  # JSON has one number type: an int is a float's value too
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{where}: {value!r} is not a number"]
    if hint is int and isinstance(value, bool):
        return [f"{where}: {value!r} is a boolean, not an integer"]
    return [] if isinstance(value, hint) else [f"{where}: {value!r} is not {hint.__name__}"]


def _any_json(hint: Any) -> bool:
    """replies.JsonValue, as get_type_hints resolves it (its recursion included)."""
    if isinstance(hint, typing.ForwardRef):
        return hint.__forward_arg__ == "JsonValue"
    arms = set(get_args(hint)) if get_origin(hint) in (types.UnionType, typing.Union) else set()
    return {str, int, float, bool, type(None)} <= arms


def fits(value: Any, hint: Any) -> None:
    found = problems(value, hint, "reply")
    assert not found, "\n".join(found)


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running() as d:
        yield d


def test_every_reply_has_the_shape_its_type_declares(daemon: Daemon) -> None:
    d = daemon
    ws = short_dir()
    with Connection(d.socket) as conn:
        fits(conn.call("ping", {}), replies.Ping)
        hello = conn.call("create", {"spec": d.write_spec("hello", HELLO).read_text(),
                                     "base": str(d.root)})  # fmt: skip
        fits(hello, replies.SessionDetail)
        asks = ASKS.format(ws=ws)
        fits(conn.call("create", {"spec": asks, "base": str(ws)}), replies.SessionDetail)
        fits(conn.call("create", {"spec": NOTES, "base": str(d.root)}), replies.SessionDetail)

        # a run: its output, its events, the session as it left it
        fits(conn.call("send", {"to": "hello", "text": "hi"}), replies.Sent)
        wait_event(d, "hello", "run.finished")
        fits(conn.call("output", {"name": "hello"}), replies.Output)
        fits(conn.call("show", {"name": "hello"}), replies.SessionDetail)
        fits(conn.call("log", {"name": "hello"}), list[EventRecord])
        page = conn.call("replay", {"name": "hello", "view": "messages"})
        assert page["messages"]
        fits(page, replies.MessagesPage)

        # a question: the inbox, the gate that says why, the answer
        fits(conn.call("activate", {"name": "asks"}), replies.SessionDetail)
        wait_event(d, "asks", "approval.requested")
        inbox = conn.call("web.approvals", {})
        assert [a["session"] for a in inbox] == ["asks"]
        fits(inbox, list[replies.ConsoleApproval])
        fits(conn.call("web.rows", {}), list[replies.ConsoleRow])
        blocked = conn.call("show", {"name": "asks"})
        assert blocked["pending_approvals"]
        fits(blocked, replies.SessionDetail)
        fits(conn.call("gate", {"name": "asks"}), replies.GateReport)
        fits(conn.call("approve", {"name": "asks"}), replies.SessionDetail)

        request: PsRequest = {"state": [], "agent": [], "label": [], "all": True,
                              "sort": "name", "footer": True}  # fmt: skip
        page = conn.call("ps", request)
        assert [r["name"] for r in page["rows"]] == ["asks", "hello", "notes"]
        fits(page, replies.PsPage)
        fits(conn.call("ps", {}), list[replies.PsRow])
        fits(conn.call("gate", {"name": "notes"}), replies.GateReport)
        fits(conn.call("cat", {"name": "notes"}), replies.SpecText)
        fits(conn.call("notify", {}), replies.NotifyStatus)
        fits(conn.call("trace.export", {"name": "hello"}), replies.TraceExport)
        fits(conn.call("models", {}), replies.ModelsReply)
        fits(conn.call("reload", {}), replies.Reloaded)

        # lineage and bundles
        fits(conn.call("fork", {"name": "notes", "new": "draft"}), replies.SessionDetail)
        fits(conn.call("merge", {"child": "draft"}), replies.Merged)
        bundle = bytearray()
        fits(conn.call_receiving("export", {"name": "notes"}, bundle.extend),
             replies.ExportedBundle)  # fmt: skip
        assert bundle
        fits(conn.call("gc", {"dry_run": True}), replies.GcReport)
        fits(conn.call("suspend", {"name": "hello"}), replies.SessionDetail)
        fits(conn.call("resume", {"name": "hello"}), replies.SessionDetail)
        fits(conn.call("cancel", {"name": "notes"}), replies.SessionDetail)
