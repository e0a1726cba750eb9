"""Traces (docs/design.md section 11): spans derived from the log, sent live over
OTLP/HTTP to a local receiver in the test and decoded with opentelemetry-proto,
and written again by `sessionctl trace export` as OTLP JSON."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.e2e.harness import running, wait_event
from tests.e2e.receivers import Received, receiving

AGENT = Path(__file__).parent / "programs" / "agent.py"
SPEC = """name = "fixer"
agent = "fixer-bot"
[run]
kind = "sdk"
exec = ["{python}", "{agent}"]
cwd = "."
env = {{ PYTHONPATH = "{root}" }}
"""


def ns(ts: str) -> int:
    moment = datetime.fromisoformat(ts)
    return int(moment.timestamp()) * 10**9 + moment.microsecond * 1000


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def decoded(requests: list[Received]) -> list[Any]:
    spans = []
    for r in requests:
        if r.path != "/v1/traces":
            continue
        message = ExportTraceServiceRequest.FromString(r.body)
        for rs in message.resource_spans:
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    return spans


def test_a_run_and_its_steps_are_exported_live_and_by_trace_export(tmp_path: Path) -> None:
    with receiving() as receiver:
        config = f'[otel]\nendpoint = "http://{receiver.url}/v1/traces"\n'
        with running(config) as d:
            (d.root / "f.txt").write_text("broken\n")
            root = Path(__file__).parents[2]
            spec = SPEC.format(python=sys.executable, agent=AGENT, root=root)
            d.ctl("create", str(d.write_spec("fixer", spec)), check=True)
            d.ctl("activate", "fixer", check=True)
            done = wait_event(d, "fixer", "lifecycle.changed",
                              match=lambda r: r["data"]["to"] == "terminated")  # fmt: skip
            assert done["data"]["outcome"] == "completed"
            events = d.json("log", "fixer")
            # the run span is the last to end: once it is there, all of the run is
            spans = receiver.wait(
                lambda reqs: (
                    (s := decoded(reqs)) and any(x.name.startswith("invoke_agent") for x in s) and s
                )
            )
            out = tmp_path / "trace.json"
            d.ctl("trace", "export", "fixer", "-o", str(out), check=True)
            printed = orjson.loads(d.ctl("trace", "export", "fixer", check=True).stdout)

    by_type: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_type.setdefault(e["type"], []).append(e)
    [run] = [s for s in spans if s.name.startswith("invoke_agent")]
    assert run.name == "invoke_agent fixer-bot"
    run_attrs = attrs(run)
    assert run_attrs["gen_ai.operation.name"] == "invoke_agent"
    assert run_attrs["gen_ai.conversation.id"] == "fixer"
    assert run_attrs["gen_ai.agent.name"] == "fixer-bot"
    assert run_attrs["sessiond.run.id"] == by_type["run.started"][0]["data"]["run"]
    assert run_attrs["sessiond.run.status"] == "ok"
    assert run.start_time_unix_nano == ns(by_type["run.started"][0]["ts"])
    assert run.end_time_unix_nano == ns(by_type["run.finished"][0]["ts"])
    assert run.parent_span_id == b""

    tools = {attrs(s)["gen_ai.tool.name"]: s for s in spans if s.name.startswith("execute_tool")}
    logged_tools = {e["data"]["tool"]: e for e in by_type["tool.started"]}
    assert set(tools) == set(logged_tools) >= {"read_file", "edit_file"}
    for name, span in tools.items():
        a = attrs(span)
        assert span.name == f"execute_tool {name}"
        assert span.parent_span_id == run.span_id
        assert span.trace_id == run.trace_id
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.call.id"] == logged_tools[name]["data"]["call"]
        assert a["gen_ai.conversation.id"] == "fixer"
        assert span.start_time_unix_nano == ns(logged_tools[name]["ts"])

    [model] = [s for s in spans if s.name.startswith("chat ")]
    m = attrs(model)
    responded = by_type["model.responded"][0]["data"]
    assert model.name == "chat scripted-1"
    assert model.parent_span_id == run.span_id
    assert m["gen_ai.request.model"] == "scripted-1"
    assert m["gen_ai.response.model"] == responded["model"]
    assert (m["gen_ai.usage.input_tokens"], m["gen_ai.usage.output_tokens"]) == (120, 8)
    assert m["gen_ai.conversation.id"] == "fixer"

    # trace export: the same spans, as OTLP JSON (hex ids), from the log
    exported = orjson.loads(out.read_bytes())
    assert exported == printed
    [resource_spans] = exported["resourceSpans"]
    assert {"key": "service.name", "value": {"stringValue": "sessiond"}} in resource_spans[
        "resource"
    ]["attributes"]
    [scope] = resource_spans["scopeSpans"]
    assert scope["schemaUrl"] == "https://opentelemetry.io/schemas/1.37.0"
    json_spans = {s["spanId"]: s for s in scope["spans"]}
    assert set(json_spans) == {s.span_id.hex() for s in spans}
    run_json = json_spans[run.span_id.hex()]
    assert run_json["traceId"] == run.trace_id.hex()
    assert run_json["name"] == run.name
    assert int(run_json["startTimeUnixNano"]) == run.start_time_unix_nano
    assert json_spans[model.span_id.hex()]["parentSpanId"] == run.span_id.hex()


def test_a_command_runs_call_nests_under_its_run_live_and_by_trace_export() -> None:
    """A command session's `execute_tool command` span is its run's child, in the
    run's trace, as the README says (it was the root of a trace of its own)."""
    with receiving() as receiver:
        config = f'[otel]\nendpoint = "http://{receiver.url}/v1/traces"\n'
        with running(config) as d:
            spec = 'name = "nightly"\nagent = "ops"\n[run]\nexec = ["sh", "-c", "echo hi"]\n'
            d.ctl("create", str(d.write_spec("nightly", spec)), check=True)
            d.ctl("activate", "nightly", check=True)
            wait_event(d, "nightly", "lifecycle.changed",
                       match=lambda r: r["data"]["to"] == "terminated")  # fmt: skip
            live = receiver.wait(
                lambda reqs: (
                    (s := decoded(reqs)) and any(x.name.startswith("invoke_agent") for x in s) and s
                )
            )
            exported = orjson.loads(d.ctl("trace", "export", "nightly", check=True).stdout)

    [run] = [s for s in live if s.name == "invoke_agent ops"]
    [tool] = [s for s in live if s.name == "execute_tool command"]
    assert (tool.parent_span_id, tool.trace_id) == (run.span_id, run.trace_id)
    assert attrs(tool)["gen_ai.tool.call.id"] == attrs(run)["sessiond.run.id"] + ".command"
    spans = {s["name"]: s for s in exported["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    assert spans["execute_tool command"]["parentSpanId"] == spans["invoke_agent ops"]["spanId"]
    assert spans["execute_tool command"]["traceId"] == spans["invoke_agent ops"]["traceId"]
    assert spans["invoke_agent ops"]["spanId"] == run.span_id.hex()
