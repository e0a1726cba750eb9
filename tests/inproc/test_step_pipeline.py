"""One round trip a step (docs/design.md section 8, "One commit per step"): the
daemon says when a step's end may be sent without waiting for its answer
(``pipeline``), and a start sent behind an end (``after``) starts only if that
end was recorded ``ok``. The SDK's side (``sdkwire.StepPipe``) is checked with
a connection that plays the daemon's answers."""

from __future__ import annotations

from typing import Any

import pytest

from sessiond.sdkwire import StepPipe
from sessiond.wire import Frame, RemoteError
from tests.inproc.fakes import FakeRun
from tests.inproc.harness import Harness

SPEC = (
    'name = "agent"\n{redact}[run]\nkind = "sdk"\nexec = ["true", "agent"]\ncwd = "."\n'
    '[policy]\nallow = ["charge_card", "wire_transfer"]\n'
)


async def test_a_start_behind_an_end_never_recorded_is_refused_and_starts_nothing(
    h: Harness,
) -> None:
    answers: list[Any] = []
    refused: list[RemoteError] = []

    @h.program("agent")
    async def agent(run: FakeRun) -> int:
        first = await run.call("sdk.step", kind="tool", name="charge_card", ordinal=1)
        answers.append(first)
        try:  # behind an end the daemon never got
            await run.call("sdk.step", kind="tool", name="wire_transfer", ordinal=2,
                           after=first["call"])  # fmt: skip
        except RemoteError as exc:
            refused.append(exc)
        await run.call("sdk.step_done", call=first["call"], status="ok", result={"n": 1})
        second = await run.call("sdk.step", kind="tool", name="wire_transfer", ordinal=2,
                                after=first["call"])  # fmt: skip
        answers.append(second)
        await run.call("sdk.step_done", call=second["call"], status="ok", result=None)
        await run.call("sdk.end", intent="complete", summary="")
        return 0

    await h.create(SPEC.format(redact=""), "agent")
    await h.call("activate", name="agent")
    await h.settle(lambda: h.session("agent").state == "terminated")
    assert [a["status"] for a in answers] == ["run", "run"]
    assert answers[0]["pipeline"] is True  # nothing masked but the token: never refused
    assert len(refused) == 1, refused
    assert refused[0].code == "refused"
    assert "not finished ok" in refused[0].message
    intents = [r["data"]["tool"] for r in await h.log("agent") if r["type"] == "tool.intent"]
    assert intents == ["charge_card", "wire_transfer"]  # the refused start wrote nothing


async def test_a_session_that_masks_a_pattern_gets_every_end_waited_for(h: Harness) -> None:
    answers: list[Any] = []

    @h.program("agent")
    async def agent(run: FakeRun) -> int:
        first = await run.call("sdk.step", kind="tool", name="charge_card", ordinal=1)
        answers.append(first)
        await run.call("sdk.step_done", call=first["call"], status="ok", result=1)
        await run.call("sdk.end", intent="complete", summary="")
        return 0

    await h.create(SPEC.format(redact='redact = ["sk-[a-z]{10,}"]\n'), "agent")
    await h.call("activate", name="agent")
    await h.settle(lambda: h.session("agent").state == "terminated")
    assert answers[0]["status"] == "run"
    assert answers[0]["pipeline"] is False  # a result may be refused: the SDK waits


class Scripted:
    """A connection whose answers are given in advance; what was sent is kept."""

    def __init__(self, answers: list[Frame]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, method: str, params: dict[str, Any]) -> int:
        self.sent.append((method, params))
        return len(self.sent)

    def receive(self) -> Frame:
        return self.answers.pop(0)


OK: Frame = {"ok": True, "result": {"stop": False}}
END = {"call": "r1.1", "status": "ok", "result": {"n": 1}, "result_b64": None}


def pipe(answers: list[Frame]) -> tuple[StepPipe, Scripted]:
    conn = Scripted(answers)
    return StepPipe(conn, "tok-abc", "agent"), conn  # type: ignore[arg-type]


def test_an_end_is_sent_and_the_next_start_follows_it_in_one_round_trip() -> None:
    p, conn = pipe([OK, {"ok": True, "result": {"status": "run", "stop": False}}])
    p.end(True, END)
    assert [m for m, _ in conn.sent] == ["sdk.step_done"]
    assert len(conn.answers) == 2  # nothing read yet: the program goes on
    answer = p.call("sdk.step", {"name": "next", "ordinal": 2})
    assert answer["status"] == "run"
    method, params = conn.sent[1]
    assert (method, params["after"], params["token"]) == ("sdk.step", "r1.1", "tok-abc")
    assert conn.answers == []  # both answers read, in order


def test_a_refused_end_is_raised_at_the_next_start_and_its_answer_is_read_too() -> None:
    refusal: Frame = {"ok": False, "error": {"code": "invalid_input", "message": "x", "exit": 5}}
    start: Frame = {"ok": False, "error": {"code": "refused", "message": "y", "exit": 1}}
    p, conn = pipe([refusal, start, OK])
    p.end(True, END)
    with pytest.raises(RemoteError) as err:
        p.call("sdk.step", {"name": "next", "ordinal": 2})
    assert err.value.code == "invalid_input"  # the end's refusal, not the start's
    p.call("ping", {})  # the connection is in step: the next answer is its own
    assert conn.answers == []


def test_an_end_the_daemon_may_refuse_is_waited_for() -> None:
    for pipeline, result in ((False, {"n": 1}), (True, {"leak": "tok-abc"})):
        p, conn = pipe([OK])
        p.end(pipeline, {**END, "result": result})
        assert conn.answers == []  # answered before the step returns
        assert p.owed is None


def test_any_other_request_waits_for_the_end_first() -> None:
    p, conn = pipe([OK, {"ok": True, "result": {"stop": True}}])
    p.end(True, END)
    p.call("sdk.end", {"intent": "complete", "summary": ""})
    assert "after" not in conn.sent[1][1]
    assert p.stop is True
