"""Spans derived from a session's log (docs/design.md section 11): a pure fold.

A run is a span (``invoke_agent``) from its ``run.started`` to its
``run.finished``; its tool steps (``execute_tool``, ``tool.started`` to
``tool.finished``) and model steps (``chat``, ``model.requested`` to
``model.responded``) are its children; so is a command run's one call, the tool
``command``, though it starts just before its run. Attributes follow the OpenTelemetry
semantic conventions for generative AI at **version 1.37.0** (``SCHEMA_URL``):
``gen_ai.operation.name``, ``gen_ai.conversation.id`` (the session),
``gen_ai.agent.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id``; what the conventions have no name
for is under ``sessiond.*``.

Ids are derived from the session, the run and the step, so exporting a session
twice (live, then with ``sessionctl trace export``) gives the same trace and
span ids: a collector sees one trace, not two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SEMCONV_VERSION = "1.37.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

Attributes = dict[str, str | int | float | bool]


def _id(size: int, *parts: str) -> int:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:size], "big") or 1  # an all-zero id is invalid


def ts_ns(ts: str) -> int:
    """An event's RFC 3339 ``ts`` as nanoseconds since the epoch."""
    moment = datetime.fromisoformat(ts)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


@dataclass
class Span:
    name: str
    trace_id: int  # 128 bits
    span_id: int  # 64 bits
    parent_id: int | None
    start_ns: int
    end_ns: int = 0
    attributes: Attributes = field(default_factory=dict)
    error: str | None = None  # the status description of a failed span; None: ok
    first_seq: int = 0
    last_seq: int = 0


class SpanBuilder:
    """Fed one session's records in seq order; hands back each span as it ends."""

    def __init__(self, session: str, agent: str = "") -> None:
        self.session = session
        self.agent = agent
        self.run: Span | None = None
        self.steps: dict[str, Span] = {}  # open tool calls by call id, model calls by request

    # a record of any event type (a live one, or read back), read by key
    def feed(self, record: Mapping[str, Any]) -> list[Span]:
        etype, data = record["type"], record.get("data") or {}
        if etype == "session.created":
            self.agent = data.get("agent") or self.agent
        elif etype == "run.started":
            name = f"invoke_agent {self.agent or self.session}"
            self.run = self._open(record, name, "run", data["run"])
            self.run.attributes.update(
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": self.agent or self.session,
                    "sessiond.run.id": data["run"],
                    "sessiond.run.kind": data.get("kind") or "",
                    "sessiond.profile": data.get("profile") or "",
                }
            )
            self._adopt(data["run"])
        elif etype == "run.finished" and self.run is not None:
            span, self.run = self.run, None
            span.attributes["sessiond.run.status"] = data.get("status") or ""
            if data.get("exit_code") is not None:
                span.attributes["sessiond.run.exit_code"] = data["exit_code"]
            if data.get("status") != "ok":
                span.error = data.get("error") or f"run {data.get('status')}"
            # steps the run left open end with it (a killed program's last call)
            ended = [self._close(s, record) for s in self.steps.values()]
            self.steps.clear()
            return [*ended, self._close(span, record)]
        elif etype == "tool.started":
            span = self._open(record, f"execute_tool {data['tool']}", "tool", data["call"])
            span.attributes.update(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": data["tool"],
                    "gen_ai.tool.call.id": data["call"],
                    "sessiond.tool.attempt": data.get("attempt") or 1,
                }
            )
            self.steps["tool:" + data["call"]] = span
        elif etype == "tool.finished" and "tool:" + data["call"] in self.steps:
            span = self.steps.pop("tool:" + data["call"])
            span.attributes["sessiond.tool.status"] = data.get("status") or ""
            if data.get("status") != "ok":
                span.error = data.get("error_class") or data.get("status") or "error"
                span.attributes["error.type"] = span.error
            return [self._close(span, record)]
        elif etype == "model.requested":
            key = "model:" + data["request_id"]
            span = self._open(record, f"chat {data['model']}", "model", data["request_id"])
            span.attributes.update(
                {"gen_ai.operation.name": "chat", "gen_ai.request.model": data["model"]}
            )
            if data.get("replayed"):
                span.attributes["sessiond.replayed"] = True
            self.steps[key] = span
        elif etype == "model.responded" and "model:" + data["request_id"] in self.steps:
            span = self.steps.pop("model:" + data["request_id"])
            span.attributes.update(
                {
                    "gen_ai.response.model": data["model"],
                    "gen_ai.usage.input_tokens": data.get("tokens_in") or 0,
                    "gen_ai.usage.output_tokens": data.get("tokens_out") or 0,
                }
            )
            if data.get("status") != "ok":
                span.error = data.get("error_class") or data.get("status") or "error"
                span.attributes["error.type"] = span.error
            return [self._close(span, record)]
        return []

    def _adopt(self, run_id: str) -> None:
        """A command run's one call (``rN.command``) starts just before its
        ``run.started``: once the run is open, that call is its child, in its trace,
        as an SDK run's steps are (a step is sent only when it ends, so nothing went
        out under the trace it had for a moment)."""
        assert self.run is not None
        for span in self.steps.values():
            call = str(span.attributes.get("gen_ai.tool.call.id", ""))
            if span.parent_id is None and call.startswith(run_id + "."):
                span.trace_id, span.parent_id = self.run.trace_id, self.run.span_id

    # feed's record: any event type
    def _open(self, record: Mapping[str, Any], name: str, kind: str, key: str) -> Span:
        """A span beginning at ``record``; a step's parent is the open run, if any."""
        parent = None if kind == "run" else self.run
        if parent is not None:
            trace_id, parent_id = parent.trace_id, parent.span_id
        else:  # a run, or a step outside any run: a trace of its own
            trace_id, parent_id = _id(16, self.session, kind, key), None
        return Span(
            name=name,
            trace_id=trace_id,
            span_id=_id(8, self.session, kind, key, str(record["seq"])),
            parent_id=parent_id,
            start_ns=ts_ns(record["ts"]),
            attributes={"gen_ai.conversation.id": self.session, "sessiond.session": self.session},
            first_seq=record["seq"],
        )

    @staticmethod
    # feed's record: any event type
    def _close(span: Span, record: Mapping[str, Any]) -> Span:
        span.end_ns = max(ts_ns(record["ts"]), span.start_ns)
        span.last_seq = record["seq"]
        span.attributes["sessiond.seq.first"] = span.first_seq
        span.attributes["sessiond.seq.last"] = span.last_seq
        return span


def spans_of(session: str, records: Any) -> list[Span]:
    """Every finished span of a session's log, in the order they ended."""
    builder = SpanBuilder(session)
    out: list[Span] = []
    for record in records:
        out.extend(builder.feed(record))
    return out
