"""The syscalls of section 11 that look at the daemon from outside: notification
targets' state (``notify``), a session's stored spec (``cat``) and its trace as
OTLP JSON (``trace.export``). They record nothing.
"""

from __future__ import annotations

import asyncio

from sessiond.errors import Refused
from sessiond.notify import Notices
from sessiond.otel import otlp_json
from sessiond.otel.spans import SpanBuilder
from sessiond.replies import NotifyStatus, SpecText, TraceExport
from sessiond.runs.context import RunContext


class Observe:
    def __init__(self, ctx: RunContext, notices: Notices | None = None) -> None:
        self.ctx = ctx
        self.notices = notices  # the daemon's notification targets, if any

    async def notify_status(self) -> NotifyStatus:
        targets = self.notices.status() if self.notices is not None else []
        return {"targets": targets}

    async def cat(self, name: str) -> SpecText:
        s = self.ctx.table.get(name)
        if s.spec_text is None:
            raise Refused(
                f"session {name!r} has no stored spec (its spec.toml is missing or unreadable); "
                "'sessionctl show' says why"
            )
        return {"name": name, "spec": s.spec_text}

    async def trace_export(self, name: str) -> TraceExport:
        """The session's spans as OTLP JSON, derived from its log now."""
        s = self.ctx.table.get(name)
        agent = s.spec.agent if s.spec is not None else ""
        store, service = self.ctx.store, self.ctx.config.otel.service_name

        def build() -> TraceExport:  # a worker thread: a long log is read and encoded
            builder = SpanBuilder(name, agent)
            spans = [span for record in store.read(name) for span in builder.feed(record)]
            return {"spans": len(spans), "otlp": otlp_json(spans, service)}

        return await asyncio.to_thread(build)
