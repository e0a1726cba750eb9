"""Which gateway steps an SDK model step wrapped (runs.wrapping), and how its reply
is written: a reply that wrapped nothing is written as before (the line has no
``wrapped``), one that did counts none of its own."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

from sessiond.log.event_data import ModelResponded, dump_data
from sessiond.runs import wrapping
from sessiond.runs.tokens import RunGrant


def test_the_steps_under_way_wrap_the_calls_made_meanwhile() -> None:
    grant = RunGrant("s", "r1")
    wrapping.called(grant, "gw.1")  # before any SDK step: nobody wraps it
    wrapping.opened(grant, "r1.m2")
    wrapping.called(grant, "gw.2")
    wrapping.opened(grant, "r1.m3")  # run at once (gather): both wrap what comes
    wrapping.called(grant, "gw.10")
    wrapping.called(grant, "gw.3")
    assert wrapping.wrapped(grant, "r1.m2", {"id": "x"}) == ("gw.2", "gw.3", "gw.10")
    assert wrapping.wrapped(grant, "r1.m3", None) == ("gw.3", "gw.10")
    assert grant.model_frames == {}
    # a step that called nothing through the gateway wraps nothing
    wrapping.opened(grant, "r1.m4")
    assert wrapping.wrapped(grant, "r1.m4", {"usage": {"input_tokens": 3}}) == ()


def test_a_response_handed_to_a_step_is_known_by_its_id() -> None:
    grant = RunGrant("s", "r1")
    wrapping.called(grant, "gw.1")
    wrapping.answered(grant, "gw.1", {"id": "msg_1", "content": []})
    wrapping.answered(grant, "gw.2", {"no": "id"})
    wrapping.opened(grant, "r1.m2")  # the response was got before the step
    assert wrapping.wrapped(grant, "r1.m2", {"id": "msg_1"}) == ("gw.1",)
    for n in range(wrapping.KEEP_IDS + 5):
        wrapping.answered(grant, f"gw.{n + 3}", {"id": f"msg_{n + 3}"})
    assert len(grant.gateway_ids) == wrapping.KEEP_IDS
    assert "msg_1" not in grant.gateway_ids  # the oldest went first


def test_own_spend_unless_it_wrapped() -> None:
    p = SimpleNamespace(tokens_in=4, tokens_out=5, cost_usd=0.25, text="hi")
    assert wrapping.spend(p, True, ()) == {
        "tokens_in": 4, "tokens_out": 5, "cost_usd": 0.25, "text": "hi"
    }  # fmt: skip
    assert wrapping.spend(p, True, ("gw.1",)) == {
        "tokens_in": 0, "tokens_out": 0, "cost_usd": None, "text": "", "wrapped": ("gw.1",)
    }  # fmt: skip


def test_a_reply_that_wrapped_nothing_is_written_as_before() -> None:
    plain = dump_data(ModelResponded(model="m", request_id="r1.m1", tokens_in=3))
    assert "wrapped" not in plain
    assert list(plain) == [
        "model", "request_id", "status", "tokens_in", "tokens_out", "cost_usd", "duration_ms",
        "text", "response", "error_class",
    ]  # fmt: skip
    wrapped = dump_data(ModelResponded(model="m", request_id="r1.m1", wrapped=("gw.1",)))
    assert wrapped["wrapped"] == ["gw.1"]


def test_many_steps_under_way_cost_a_gateway_call_nothing_more() -> None:
    """A program may open many SDK model steps and leave them under way, then call
    the gateway many times: each call is noted once, not once for every step under
    way (that held the daemon's loop for a pass over every step's list at each call,
    and kept steps x calls keys in its memory)."""
    grant = RunGrant("s", "r1")
    steps, calls = 1000, 300
    for n in range(steps):
        wrapping.opened(grant, f"r1.m{n}")
    keys = [f"gw.{n}" for n in range(calls)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for key in keys:
            wrapping.called(grant, key)
        grew = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grew < 64 * 1024  # a few KB: one note a call (steps x calls was MBs)
    # and every step still wraps the calls made while it was under way
    assert wrapping.wrapped(grant, "r1.m0", None) == tuple(keys)
    wrapping.opened(grant, "r1.late")
    wrapping.called(grant, "gw.900")
    assert wrapping.wrapped(grant, "r1.late", None) == ("gw.900",)
    assert wrapping.wrapped(grant, "r1.m1", None) == (*keys, "gw.900")
    for n in range(2, steps):
        wrapping.wrapped(grant, f"r1.m{n}", None)
    assert grant.model_frames == {}
    assert grant.gateway_called == []  # nothing kept once no step is under way
