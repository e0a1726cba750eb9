"""The spans a log makes (sessiond.otel.spans: a pure fold; unit tests of logic)."""

from __future__ import annotations

from typing import Any

from sessiond.otel import otlp_json
from sessiond.otel.spans import SpanBuilder, spans_of, ts_ns

TS = "2026-12-01T10:00:{:02d}.000000Z"


def log(*events: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"seq": n, "ts": TS.format(n), "type": etype, "data": data}
        for n, (etype, data) in enumerate(events, 1)
    ]


RUN = log(
    ("session.created", {"agent": "bot"}),
    ("run.started", {"run": "r1", "kind": "sdk", "profile": "default"}),
    ("tool.started", {"call": "c1", "tool": "read_file", "attempt": 1}),
    ("model.requested", {"model": "m", "request_id": "q1"}),
    ("tool.finished", {"call": "c1", "tool": "read_file", "status": "ok"}),
    (
        "model.responded",
        {"model": "m-2", "request_id": "q1", "status": "ok", "tokens_in": 10, "tokens_out": 3},
    ),
    ("tool.started", {"call": "c2", "tool": "edit", "attempt": 1}),
    ("run.finished", {"run": "r1", "status": "lost", "exit_code": None, "error": "cut off"}),
)


def test_a_run_and_its_steps_nest_with_their_times() -> None:
    tool, model, cut, run = spans_of("s", RUN)
    assert run.name == "invoke_agent bot"
    assert run.parent_id is None
    assert run.error == "cut off"  # a lost run is an error span
    assert (run.start_ns, run.end_ns) == (ts_ns(TS.format(2)), ts_ns(TS.format(8)))
    assert tool.name == "execute_tool read_file"
    assert tool.error is None
    assert (tool.parent_id, tool.trace_id) == (run.span_id, run.trace_id)
    assert (tool.attributes["sessiond.seq.first"], tool.attributes["sessiond.seq.last"]) == (3, 5)
    assert model.attributes["gen_ai.usage.input_tokens"] == 10
    assert model.attributes["gen_ai.response.model"] == "m-2"
    assert model.attributes["gen_ai.conversation.id"] == "s"
    # the step the run left open ends with it
    assert cut.name == "execute_tool edit"
    assert cut.end_ns == run.end_ns


def test_ids_come_from_the_log_so_two_exports_agree() -> None:
    first = [(s.trace_id, s.span_id) for s in spans_of("s", RUN)]
    assert first == [(s.trace_id, s.span_id) for s in spans_of("s", RUN)]
    assert first != [(s.trace_id, s.span_id) for s in spans_of("other", RUN)]


def test_a_step_outside_a_run_has_a_trace_of_its_own() -> None:
    builder = SpanBuilder("s")
    assert builder.feed(log(("tool.started", {"call": "c", "tool": "t"}))[0]) == []
    [span] = builder.feed(
        {"seq": 2, "ts": TS.format(2), "type": "tool.finished",
         "data": {"call": "c", "tool": "t", "status": "error", "error_class": "execution"}}
    )  # fmt: skip
    assert span.parent_id is None
    assert span.error == "execution"
    assert span.attributes["error.type"] == "execution"


def test_otlp_json_has_hex_ids_and_integer_enums() -> None:
    spans = spans_of("s", RUN)
    message: Any = otlp_json(spans, "svc")  # read as the JSON it is
    [scope_spans] = message["resourceSpans"][0]["scopeSpans"]
    run = scope_spans["spans"][-1]
    assert run["traceId"] == f"{spans[-1].trace_id:032x}"
    assert run["spanId"] == f"{spans[-1].span_id:016x}"
    assert run["status"] == {"code": 2, "message": "cut off"}
    assert run["kind"] == 1  # SPAN_KIND_INTERNAL
    assert scope_spans["spans"][1]["kind"] == 3  # a model call is a client span


def test_a_command_runs_call_is_a_child_of_its_run() -> None:
    """A command run's one call starts just before its run.started (the order the
    daemon writes them in): it nests under the run all the same, in its trace."""
    command = log(
        ("session.created", {"agent": "bot"}),
        ("tool.started", {"call": "r1.command", "tool": "command", "attempt": 1}),
        ("run.started", {"run": "r1", "kind": "command", "profile": "default"}),
        ("tool.finished", {"call": "r1.command", "tool": "command", "status": "ok"}),
        ("run.finished", {"run": "r1", "status": "ok", "exit_code": 0}),
        # the next run's call is that run's, not the first one's
        ("tool.started", {"call": "r2.command", "tool": "command", "attempt": 1}),
        ("run.started", {"run": "r2", "kind": "command", "profile": "default"}),
        ("run.finished", {"run": "r2", "status": "ok", "exit_code": 0}),
    )
    tool, run, tool2, run2 = spans_of("s", command)
    assert (tool.name, run.name) == ("execute_tool command", "invoke_agent bot")
    assert (tool.parent_id, tool.trace_id) == (run.span_id, run.trace_id)
    assert (tool2.parent_id, tool2.trace_id) == (run2.span_id, run2.trace_id)
    assert run.trace_id != run2.trace_id
