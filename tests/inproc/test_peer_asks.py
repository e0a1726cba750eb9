"""How often a request on the control socket asks whether its peer may act
(sessiond.ipc.dispatch, sessiond.ipc.runpeer): each ask is a system call (a poll
of the peer's pidfd) on every request's path, a `send`'s included."""

from __future__ import annotations

import asyncio
import os
from typing import Any, cast

import orjson

from sessiond.ipc.dispatch import Caller
from sessiond.ipc.frames import Frames
from tests.inproc.harness import Harness, _Writer

NOTES = """name = "notes"
goal = "collect notes"
"""


class CountingExaminer:
    """Stands for sessiond.ipc.runpeer.Examiner: an operator's process, counted."""

    def __init__(self, refusal: str | None = None) -> None:
        self.asked = 0
        self.said = False
        self.answer = refusal

    def refusal(self) -> str | None:
        self.asked += 1
        return self.answer


async def _send(h: Harness, examiner: CountingExaminer) -> list[dict[str, Any]]:
    caller = Caller("control", os.getuid(), examiner=cast(Any, examiner), pid=os.getpid())
    frame = {"id": 1, "method": "send", "params": {"to": "notes", "text": "hi"}}
    reader = asyncio.StreamReader()
    reader.feed_eof()
    writer = _Writer()
    await h.control.handle(orjson.dumps(frame), Frames(reader, 1 << 20), cast(Any, writer), caller)
    return writer.answers()


async def test_a_send_asks_once_whether_its_peer_may_act(h: Harness) -> None:
    await h.create(NOTES)
    examiner = CountingExaminer()
    answers = await _send(h, examiner)
    assert answers[0]["ok"] is True, answers
    assert answers[0]["result"]["seq"] > 0
    assert examiner.asked == 1  # twice before: before and after the (unawaited) open


async def test_a_request_that_waited_for_its_session_asks_again(h: Harness) -> None:
    """A start-up still opening sessions: the request waits for its own, and its
    peer, which may have gone meanwhile, is asked again after the wait."""
    await h.create(NOTES)
    h.table.loading = True  # as while the table index's sessions are opened
    h.table.recovered.set()  # (its own session is open: the wait ends at once)
    h.table.ready.set()
    examiner = CountingExaminer()
    try:
        answers = await _send(h, examiner)
    finally:
        h.table.loading = False
    assert answers[0]["ok"] is True, answers
    assert examiner.asked == 2


async def test_a_peer_refused_is_refused_before_anything_is_written(h: Harness) -> None:
    await h.create(NOTES)
    before = len(await h.log("notes"))
    examiner = CountingExaminer("this connection may only ping: it is a process of a run")
    answers = await _send(h, examiner)
    assert answers[0]["ok"] is False
    assert answers[0]["error"]["code"] == "permission_denied", answers
    assert len(await h.log("notes")) == before
