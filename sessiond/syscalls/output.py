"""``output``: what a run printed, finished or still running (``sessionctl output``).

A finished run's stdout and stderr are artifacts, referenced from its
``run.finished`` (masked by the session's redaction when stored). A running
run's output is not on disk yet: the daemon reads the program's pipes itself
and keeps what came (up to ``max_output_bytes``), so that is where a running
run's output is served from, masked the same way, and only up to its last
complete line. Lines are masked one whole line at a time, so what was served of
a running run is a prefix of the artifact it becomes: a reader can go on from
the same offset when the run ends.

Following is a long poll, never a stream: ``wait`` seconds (at most 30) for
output past ``offset``, the run's end or, with ``after``, a run newer than that
one. Each request is one answer, so nothing holds the session's lock and a
reader that goes away costs nothing.
"""

from __future__ import annotations

import asyncio
import difflib
import re
from typing import Any, cast

from sessiond.errors import InvalidInput, NoSuchSession, Refused
from sessiond.log.event_records import RunFinishedData
from sessiond.log.store.base import Record
from sessiond.redaction import Redactor
from sessiond.replies import Output, RunFacts
from sessiond.runs.context import RunContext
from sessiond.runs.program import Program
from sessiond.runs.tokens import Tokens
from sessiond.table.sessions import Session

RUN_ID = re.compile(r"r[1-9][0-9]{0,9}")
WAIT_MAX = 30.0
STREAMS = ("stdout", "stderr")
CHUNK = 1 << 20  # characters per answer; ``more`` says there is more to ask for


def _number(run: str | None) -> int:
    return int(run[1:]) if run else 0


class RunOutput:
    def __init__(self, ctx: RunContext, tokens: Tokens) -> None:
        self.ctx = ctx
        self.tokens = tokens

    def _session(self, name: str) -> Session:
        try:
            return self.ctx.table.get(name)
        except NoSuchSession as exc:
            names = [*self.ctx.table.sessions, *self.ctx.table.pending]  # open or not yet
            near = difflib.get_close_matches(name, names, 1)
            if not near:
                raise
            raise NoSuchSession(f"{exc}; did you mean {near[0]!r}?") from None

    async def output(
        self,
        name: str,
        run: str | None = None,
        stream: str = "stdout",
        *,
        offset: int = 0,
        wait: float = 0.0,
        after: str | None = None,
    ) -> Output:
        """Run ``run``'s (else the newest run's) ``stream`` from character ``offset``.
        With ``after`` (no ``run``): the newest run only if it is newer than that."""
        s = self._session(name)
        for given, what in ((run, "run"), (after, "after")):
            if given is not None and not RUN_ID.fullmatch(given):
                raise InvalidInput(
                    f"{what} {given!r} is not a run: runs are named r1, r2, ... "
                    f"('sessionctl log {name} --type run.started' lists them)"
                )
        if stream not in STREAMS:
            raise InvalidInput(f"stream {stream!r}: give stdout or stderr")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(wait, WAIT_MAX))
        while True:
            changed = loop.create_future()
            stop = self.ctx.table.listen(_on_run_event(s.name, changed))
            program = s.run.program if s.run is not None else None
            if isinstance(program, Program):
                program.output_changed().add_done_callback(_settles(changed))
            try:
                answer = await self._answer(s, run, stream, offset, after, waiting=wait > 0)
                settled = answer["run"] is not None and (answer["data"] or not answer["running"])
                left = deadline - loop.time()
                if settled or left <= 0:
                    return answer
                await asyncio.wait([changed], timeout=left)
            finally:
                stop()

    async def _answer(
        self,
        s: Session,
        run: str | None,
        stream: str,
        offset: int,
        after: str | None,
        *,
        waiting: bool,
    ) -> Output:
        state = s.journal.state
        latest = state.current_run or state.last_run
        newest = latest["run"] if latest else None
        target = run or newest
        nothing: Output = {"session": s.name, "run": None, "stream": stream, "running": False,
                   "data": "", "offset": offset, "next_offset": offset}  # fmt: skip
        if run is None and after is not None and _number(newest) <= _number(after):
            return nothing  # no newer run yet
        if target is None:
            if waiting:
                return nothing
            raise Refused(
                f"session {s.name!r} has not run yet: there is no output to show; "
                f"'sessionctl activate {s.name}' starts a run"
            )
        text, facts = await self._text(s, target, stream)
        offset = min(max(offset, 0), len(text))
        end = min(len(text), offset + CHUNK)  # one answer stays well under a frame
        answer: Output = {
            "session": s.name,
            "run": target,
            "stream": stream,
            "running": facts["running"],
            "data": text[offset:end],
            "offset": offset,
            "next_offset": end,
            "more": end < len(text),
        }
        answer["status"] = facts["status"]  # how the run stands
        if "exit_code" in facts:  # a finished one: how it ended, and a cut
            answer["exit_code"] = facts["exit_code"]
            answer["cut"] = facts.get("cut", "")
        return answer

    async def _text(self, s: Session, run: str, stream: str) -> tuple[str, RunFacts]:
        state = s.journal.state
        index = STREAMS.index(stream)
        live = s.run if s.run is not None and s.run.run_id == run else None
        if live is not None or (state.current_run and state.current_run["run"]) == run:
            program = live.program if live is not None else None
            raw = program.output_so_far(index) if isinstance(program, Program) else b""
            raw = raw[: raw.rfind(b"\n") + 1]  # whole lines only (see the module's doc)
            return self._masked(s, raw), {"running": True, "status": "running"}
        finished: RunFinishedData | None = (
            state.last_run if state.last_run and state.last_run["run"] == run else None
        )
        if finished is None:
            finished = await asyncio.to_thread(self._find, s.name, run)
        if finished is None:
            runs = state.run_number or state.runs
            have = f"its runs are r1 to r{runs}" if runs else "it has not run yet"
            raise Refused(f"session {s.name!r} has no run {run}: {have}")
        facts: RunFacts = {
            "running": False,
            "status": finished.get("status", "unknown"),
            "exit_code": finished.get("exit_code"),
            "cut": finished.get("error") or "",
        }
        ref = finished.get("stdout") if stream == "stdout" else finished.get("stderr")
        if not ref:
            return "", facts
        store = self.ctx.store.artifacts(s.name)
        data = await asyncio.to_thread(store.get, ref["ref"])
        return data.decode(errors="replace"), facts

    def _masked(self, s: Session, raw: bytes) -> str:
        spec = s.spec
        patterns = spec.redact if spec is not None else ()
        redactor = Redactor(patterns, [*s.masked, *self.tokens.grants])
        return redactor.data(raw).decode(errors="replace")

    def _find(self, name: str, run: str) -> RunFinishedData | None:
        """The ``run.finished`` of ``run`` (a worker thread: the log is read)."""
        found: RunFinishedData | None = None
        for record in self.ctx.store.read(name):
            if record["type"] == "run.finished" and record["data"].get("run") == run:
                found = cast(RunFinishedData, dict(record["data"]))  # its type's data
        return found


def _on_run_event(name: str, changed: asyncio.Future[None]) -> Any:
    settle = _settles(changed)

    def listener(session: str, record: Record) -> None:
        if session == name and record["type"] in ("run.started", "run.finished"):
            settle(None)

    return listener


def _settles(changed: asyncio.Future[None]) -> Any:
    def settle(_arg: object) -> None:
        if not changed.done():
            changed.set_result(None)

    return settle
