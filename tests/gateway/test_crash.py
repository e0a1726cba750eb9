"""kill -9 of the daemon in the middle of a streamed model call. The stream cut off
is a step started and not finished: the turn goes on in a later run after the
restart, where the call that finished is answered from the log (the upstream's
counter does not move for it) and the cut one is asked again, once."""

from __future__ import annotations

from sessiond.gateway.scripted import Reply, text
from tests.e2e.harness import wait_event
from tests.gateway.rig import gateway, results, session


def test_kill_9_mid_stream_then_the_turn_is_answered_from_the_log() -> None:
    script = [
        Reply.of(text("first"), input_tokens=20, output_tokens=2),
        Reply.of(text("cut off"), hold=True),  # held half-way through its stream
        Reply.of(text("second"), input_tokens=21, output_tokens=3),
    ]
    plan = [
        {"api": "messages", "stream": True, "text": "one"},
        {"api": "messages", "stream": True, "text": "two"},
    ]
    with gateway(script) as (d, up):
        cwd = session(d, "crash", plan)
        d.ctl("activate", "crash", check=True)
        up.wait_count(2)  # the second call's stream is under way, held by the upstream
        assert up.count == 2
        d.kill9()
        up.release()  # (its stream has no reader left)
        assert [r.get("text") for r in results(cwd)] == ["first"]

        d.start()
        # the unfinished turn goes on by itself, in a new run, after the gate
        wait_event(d, "crash", "run.finished", match=lambda r: r["data"].get("run") != "r1",
                   timeout=90)  # fmt: skip
        got = results(cwd)
        assert [(r.get("text"), r.get("usage")) for r in got] == [
            ("first", [20, 2]),
            ("first", [20, 2]),  # from the log, streamed again: no upstream call
            ("second", [21, 3]),
        ]
        assert up.count == 3  # the cut call once more, the finished one never again
        responded = d.json("log", "crash", "--type", "model.responded")
        assert [(r["data"]["text"], r["data"]["status"]) for r in responded] == [
            ("first", "ok"),
            ("second", "ok"),
        ]
        assert d.json("show", "crash")["state"] in ("sleeping", "terminated")
