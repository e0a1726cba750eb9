"""``GET /metrics``: the daemon in the Prometheus text format (prometheus-client).

Names follow Prometheus' conventions (docs/web.md lists them): counters end in
``_total``, durations are ``_seconds`` histograms. What is a count of the table
(sessions by state, approvals pending) is read from it at each scrape, so it is
never stale; what happens (events appended, runs finished, a wake reaching its
program) is counted as the table's listener sees it, since the daemon started.
The fsync histogram wraps the log's fsync hook (it runs in worker threads; the
client's metrics are thread-safe).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sessiond.log.pace import Pacer
from sessiond.log.store.base import Record
from sessiond.replies import ModelsView
from sessiond.table.sessions import Table
from sessiond.web.model_metrics import ModelCollector

STATES = ("created", "ready", "running", "sleeping", "suspended", "blocked", "terminated")
OUTCOMES = ("ok", "failed", "interrupted", "killed", "timeout", "lost")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# from a millisecond to ten minutes: a wake may wait in the queue for a slot
LATENCY = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
FSYNC = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)


class TableCollector(Collector):
    """Counted at each scrape: sessions by state, approvals waiting for a person.

    ``count`` walks the table in slices (10,000 sessions held the loop for tens of
    milliseconds in one piece); ``collect``, which prometheus-client calls
    synchronously, gives what it counted."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.states: dict[str, int] = dict.fromkeys(STATES, 0)
        self.pending = 0

    async def count(self) -> None:
        states = dict.fromkeys(STATES, 0)
        pending = 0
        pacer = Pacer()
        await self.table.ensure_all()  # the approvals waiting are in the logs
        for s in list(self.table):
            if pacer.due():
                await pacer.pause()
            states[s.state] = states.get(s.state, 0) + 1
            if s.journal_or_none is not None and s.journal.state.approvals:
                pending += len(s.journal.state.pending_approvals())
        self.states, self.pending = states, pending

    def collect(self) -> Iterator[Metric]:
        states, pending = self.states, self.pending
        sessions = GaugeMetricFamily("sessiond_sessions", "Sessions by state", labels=["state"])
        for state, n in states.items():
            sessions.add_metric([state], n)
        yield sessions
        yield GaugeMetricFamily(
            "sessiond_approvals_pending", "Approvals waiting for a person's answer", value=pending
        )


class _Read(Collector):
    """A counter read at each scrape from what counts it (no copy to keep in step)."""

    def __init__(self, name: str, doc: str, read: Callable[[], int]) -> None:
        self.name, self.doc, self.read = name, doc, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.doc, value=self.read())


class _Boundary(Collector):
    """1 while runs are confined by the sandbox, 0 when the operator turned it off."""

    def __init__(self, read: Callable[[], bool]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "sessiond_boundary_sandbox",
            "1: runs are confined by the sandbox; 0: [run] sandbox is off",
            value=1 if self.read() else 0,
        )


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.appends = Counter(
            "sessiond_events_appended", "Events appended to session logs", registry=r
        )
        self.runs = Counter("sessiond_runs", "Runs finished, by outcome", ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.runs.labels(outcome=outcome)
        self.wake_to_exec = Histogram(
            "sessiond_wake_to_exec_seconds",
            "From a wake's record to its run's start (gate and queue included)",
            buckets=LATENCY,
            registry=r,
        )
        self.gate = Histogram(
            "sessiond_gate_seconds",
            "From a wake's record to the gate's verdict on it",
            buckets=LATENCY,
            registry=r,
        )
        self.fsync = Histogram(
            "sessiond_fsync_seconds", "One fsync of a session log", buckets=FSYNC, registry=r
        )
        # failed deliveries since the start, counted by the targets (sessiond.notify)
        self.notify_failed: Callable[[], int] = lambda: 0
        r.register(_Read("sessiond_notify_failures", "Notices that failed to be delivered",
                         self._notify_failed))  # fmt: skip
        self.sandbox: Callable[[], bool] = lambda: True  # set by the web server
        r.register(_Boundary(self._sandbox))
        # the model gateway's view (set by the web server; None: no gateway)
        self.models: Callable[[], ModelsView | None] = lambda: None
        r.register(ModelCollector(self._models))
        self.table_counts: TableCollector | None = None
        self._woken: dict[str, float] = {}  # session -> when its oldest waiting wake came

    def _models(self) -> ModelsView | None:
        return self.models()  # read late, as notify_failed

    def _sandbox(self) -> bool:
        return self.sandbox()  # read late, as notify_failed

    def _notify_failed(self) -> int:
        return self.notify_failed()  # read late: the server sets it after this is made

    def watch(self, table: Table) -> Callable[[], None]:
        self.table_counts = TableCollector(table)
        self.registry.register(self.table_counts)
        return table.listen(self.on_event)

    def on_event(self, name: str, record: Record) -> None:
        """The table's listener: called for every event appended, on the loop."""
        self.appends.inc()
        kind = record["type"]
        if kind == "wake.requested":
            self._woken.setdefault(name, time.monotonic())
        elif kind == "gate.evaluated" and name in self._woken:
            self.gate.observe(time.monotonic() - self._woken[name])
        elif kind == "run.started":
            woken = self._woken.pop(name, None)
            if woken is not None:
                self.wake_to_exec.observe(time.monotonic() - woken)
        elif kind == "run.finished":
            self.runs.labels(outcome=record["data"].get("status", "lost")).inc()
        elif kind == "lifecycle.changed" and record["data"].get("to") == "terminated":
            self._woken.pop(name, None)

    async def render(self) -> bytes:
        if self.table_counts is not None:
            await self.table_counts.count()
        return generate_latest(self.registry)
