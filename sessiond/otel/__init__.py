"""Traces (docs/design.md section 11): the spans of sessiond.otel.spans, made
OpenTelemetry spans, exported live over OTLP/HTTP when ``[otel] endpoint`` is
set, and written as OTLP JSON for any past session (``sessionctl trace
export``): the log is the source, so both give the same spans.

opentelemetry is imported here only, when traces are asked for: a daemon
without ``[otel]`` never loads it.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterable
from typing import Any

import structlog

from sessiond import __version__
from sessiond.config import DaemonConfig
from sessiond.log.store.base import Record
from sessiond.otel.spans import SCHEMA_URL, Span, SpanBuilder
from sessiond.replies import JsonObject
from sessiond.table.sessions import Table

log = structlog.get_logger(__name__)

SCOPE = "sessiond"


def readable(spans: Iterable[Span], service_name: str) -> list[Any]:
    """Our spans as the SDK's ReadableSpans (what its exporters and encoders take)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    resource = Resource.create({"service.name": service_name, "service.version": __version__})
    scope = InstrumentationScope(SCOPE, __version__, SCHEMA_URL)
    out = []
    for span in spans:
        flags = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=flags)
        parent = (
            SpanContext(span.trace_id, span.parent_id, is_remote=False, trace_flags=flags)
            if span.parent_id is not None
            else None
        )
        status = (
            Status(StatusCode.ERROR, span.error)
            if span.error is not None
            else Status(StatusCode.OK)
        )
        out.append(
            ReadableSpan(
                name=span.name,
                context=context,
                parent=parent,
                resource=resource,
                attributes=span.attributes,
                kind=SpanKind.CLIENT if span.name.startswith("chat ") else SpanKind.INTERNAL,
                status=status,
                start_time=span.start_ns,
                end_time=span.end_ns,
                instrumentation_scope=scope,
            )
        )
    return out


def otlp_json(spans: Iterable[Span], service_name: str = "sessiond") -> JsonObject:
    """An OTLP/JSON ``ExportTraceServiceRequest`` of ``spans`` (what a collector's
    ``/v1/traces`` takes with ``Content-Type: application/json``)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    # protobuf's JSON as MessageToDict gives it, rewritten below where OTLP differs
    message: dict[str, Any] = MessageToDict(
        encode_spans(readable(spans, service_name)), use_integers_for_enums=True
    )
    # OTLP/JSON differs from protobuf's JSON mapping here: ids are hex, not base64
    for resource_spans in message.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return message


class Traces:
    """The live export: every span the appends end, to ``[otel] endpoint``."""

    def __init__(self, config: DaemonConfig, table: Table) -> None:
        self.config = config
        self.table = table
        self.builders: dict[str, SpanBuilder] = {}
        self._processor: Any = None
        self._unlisten: Any = None

    def start(self) -> None:
        otel = self.config.otel
        if otel.endpoint is None:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporter = OTLPSpanExporter(endpoint=otel.endpoint, headers=otel.headers or None)
        # its own thread batches and sends: the loop only hands spans over
        self._processor = BatchSpanProcessor(exporter, schedule_delay_millis=1000)
        self._unlisten = self.table.listen(self._on_record)
        log.info("otel.exporting", endpoint=otel.endpoint)

    def _on_record(self, session: str, record: Record) -> None:
        builder = self.builders.get(session)
        if builder is None:
            s = self.table.sessions.get(session)
            agent = s.spec.agent if s is not None and s.spec is not None else ""
            builder = self.builders[session] = SpanBuilder(session, agent)
        try:
            ended = builder.feed(record)
        except (KeyError, TypeError, ValueError):  # a record of an older shape: no span
            log.warning("otel.unreadable", session=session, seq=record.get("seq"))
            return
        for span in readable(ended, self.config.otel.service_name):
            self._processor.on_end(span)

    async def close(self) -> None:
        """Send what is batched (the processor's shutdown flushes), off the loop."""
        if self._unlisten is not None:
            self._unlisten()
        if self._processor is not None:
            await asyncio.to_thread(self._processor.shutdown)
