"""A program that wraps an official client's call through the gateway in the SDK's
``run.model_call``: the call goes upstream once and is spent once, in the log's
fold, in ``sessionctl models`` and against a budget, also after a kill -9 between
the gateway's record and the step's end. A model_call that does not go through
the gateway (no gateway in the daemon) still counts its own tokens."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sessiond.gateway.scripted import Reply, Upstream, text
from tests.e2e.harness import Daemon, running, wait_event
from tests.gateway.rig import gateway, results

PROGRAM = Path(__file__).parent / "programs" / "wrapped.py"

# Two calls of 50 tokens each (40 in, 10 out). The budget takes them counted once
# (100) with what the second one may still spend (its input's estimate and its
# 20-token cap), and not counted twice: the first alone would be 100.
BUDGET = 130
SPEC = """name = "{name}"
goal = "call models"
[run]
kind = "sdk"
exec = ["{python}", "{program}"]
cwd = "{cwd}"
retries = 1
[model]
allow = ["claude-*", "gpt-*"]
[budget]
tokens = {budget}
tokens_per_day = {budget}
"""


def replies() -> list[Reply]:
    return [Reply.of(text(f"r{i}"), input_tokens=40, output_tokens=10) for i in range(2)]


def start(d: Daemon, name: str, plan: dict[str, Any]) -> Path:
    cwd = d.root / f"ws-{name}"
    cwd.mkdir()
    cwd.chmod(0o777)  # the run's uid writes its results here
    (cwd / "plan.json").write_text(json.dumps(plan))
    spec = SPEC.format(name=name, python=sys.executable, program=PROGRAM, cwd=cwd, budget=BUDGET)
    d.ctl("create", str(d.write_spec(name, spec)), check=True)
    d.ctl("activate", name, check=True)
    return cwd


def completed(d: Daemon, name: str) -> None:
    """The session ends its work: terminated (a double count suspends it on its budget)."""
    ends = ("terminated", "suspended")
    ended = wait_event(
        d, name, "lifecycle.changed", match=lambda r: r["data"]["to"] in ends, timeout=90
    )
    assert ended["data"]["to"] == "terminated", ended["data"]


def spent_once(d: Daemon, name: str) -> list[dict[str, Any]]:
    """The session's two calls counted once everywhere; its model.responded records."""
    assert d.json("log", name, "--type", "budget.exhausted") == []
    shown = d.json("show", name)
    assert shown["budget_used"]["tokens"] == 100  # the fold: 2 calls of 50
    assert shown["outcome"] == "completed"
    (mine,) = [m for m in d.json("models")["sessions"] if m["session"] == name]
    assert mine["tokens"] == 100
    assert f"100/{BUDGET}" in d.ctl("models", check=True).stdout
    responded: list[dict[str, Any]] = d.json("log", name, "--type", "model.responded")
    return [r["data"] for r in responded]


def sdk_steps(responded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The SDK's model steps' records (the gateway's are the ones that count)."""
    gw = {r["request_id"] for r in responded if r["tokens_in"]}
    return [r for r in responded if r["request_id"] not in gw]


def test_a_wrapped_gateway_call_is_sent_once_and_spent_once() -> None:
    for api, order in (("messages", "inside"), ("chat", "inside"), ("messages", "before")):
        with gateway(replies()) as (d, up):
            name = f"wrap-{api}-{order}"
            cwd = start(d, name, {"api": api, "order": order, "texts": ["one", "two"]})
            completed(d, name)
            assert up.count == 2
            got = results(cwd)
            assert [r["id"] is not None for r in got] == [True, True]
            responded = spent_once(d, name)
            # each call recorded by the gateway with its tokens, and the SDK's step
            # naming the gateway's step it wrapped, with none of its own
            assert [(r["tokens_in"], r["tokens_out"]) for r in responded if r["tokens_in"]] == [
                (40, 10),
                (40, 10),
            ]
            sdk = sdk_steps(responded)
            assert [(s["wrapped"], s["tokens_out"], s["text"]) for s in sdk] == [
                (["gw.1"], 0, ""),
                (["gw.2"], 0, ""),
            ]
            assert all(s["cost_usd"] is None for s in sdk)


def test_async_model_calls_at_once_are_spent_once() -> None:
    """``asyncio.gather`` of two wrapped calls: each step is under way while both
    gateway calls are made, so each wraps both; the gateway's records count."""
    with gateway(replies()) as (d, up):
        start(d, "gather", {"api": "messages", "async": True, "texts": ["one", "two"]})
        completed(d, "gather")
        assert up.count == 2
        sdk = sdk_steps(spent_once(d, "gather"))
        assert len(sdk) == 2
        assert all(s["wrapped"] and s["tokens_in"] == 0 for s in sdk)


def test_kill_9_between_the_gateways_record_and_the_steps_end() -> None:
    """The program dies once its call is recorded by the gateway and before its
    step's end. The next run of the turn asks the step again: the gateway answers
    its call from the log (nothing upstream), and it is still spent once."""
    with gateway(replies()) as (d, up):
        plan = {"api": "messages", "order": "inside", "crash": True, "texts": ["one", "two"]}
        cwd = start(d, "cut", plan)
        completed(d, "cut")
        assert up.count == 2  # the first call once, never again; then the second
        runs = d.json("log", "cut", "--type", "run.finished")
        assert len(runs) == 2
        assert len(results(cwd)) == 2  # (the first run wrote none)
        responded = spent_once(d, "cut")
        sdk = sdk_steps(responded)
        # the first run's step has no end; the second's wrapped the same gw.1
        assert [s["request_id"] for s in sdk] == ["r2.m1", "r2.m2"]
        assert [s["wrapped"] for s in sdk] == [["gw.1"], ["gw.2"]]


def test_kill_9_of_the_daemon_mid_step_then_the_turn_goes_on() -> None:
    """The daemon dies while the program is inside its step, the call recorded by
    the gateway. After the restart the turn goes on in a new run, which is answered
    from the log: one upstream call for it, spent once."""
    with gateway(replies()) as (d, up):
        plan = {"api": "messages", "crash": True, "hold": True, "texts": ["one", "two"]}
        cwd = start(d, "dcut", plan)
        wait_event(d, "dcut", "model.responded")  # the gateway's record of the first call
        d.kill9()
        (cwd / "go.now").touch()  # (a held program left by its daemon ends at its socket)
        d.start()
        completed(d, "dcut")
        assert up.count == 2
        responded = spent_once(d, "dcut")
        assert [len(s["wrapped"]) for s in sdk_steps(responded)] == [1, 1]


def test_a_model_call_without_the_gateway_counts_its_own_tokens() -> None:
    """No gateway in the daemon: the program calls the upstream itself, and its
    step's own usage is what is spent."""
    with Upstream(replies()) as up, running() as d:
        plan = {"api": "messages", "order": "inside", "texts": ["one", "two"],
                "base_url": up.url}  # fmt: skip
        start(d, "direct", plan)
        completed(d, "direct")
        assert up.count == 2
        shown = d.json("show", "direct")
        assert shown["budget_used"]["tokens"] == 100
        responded = [r["data"] for r in d.json("log", "direct", "--type", "model.responded")]
        assert [(r["tokens_in"], r["tokens_out"], "wrapped" in r) for r in responded] == [
            (40, 10, False),
            (40, 10, False),
        ]
