"""A budget crossed at the gateway: the call that would pass it is refused in the
provider's shape (the official SDK raises it), nothing goes upstream, and the
session is suspended with the budget's reason, as a spent budget does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sessiond.gateway.scripted import Reply, text
from sessiond.replies import ModelsReply
from tests.e2e.harness import Daemon, wait_event
from tests.e2e.test_replies import fits
from tests.gateway.rig import CLIENT, gateway, results

SPEC = """name = "{name}"
agent = "{agent}"
[run]
kind = "sdk"
exec = ["{python}", "{client}"]
cwd = "{cwd}"
[model]
allow = ["claude-*"]
[budget]
{budget}
"""
CALL = {"api": "messages", "stream": False, "text": "go"}


def start(d: Daemon, name: str, budget: str, calls: int, agent: str = "") -> Path:
    cwd = d.root / f"ws-{name}"
    cwd.mkdir()
    cwd.chmod(0o777)
    (cwd / "plan.json").write_text(json.dumps([CALL] * calls))
    spec = SPEC.format(name=name, agent=agent, python=sys.executable, client=CLIENT, cwd=cwd,
                       budget=budget)  # fmt: skip
    d.ctl("create", str(d.write_spec(name, spec)), check=True)
    d.ctl("activate", name, check=True)
    return cwd


def test_a_call_past_the_days_tokens_is_refused_and_the_session_suspended() -> None:
    replies = [Reply.of(text(f"r{i}"), input_tokens=40, output_tokens=10) for i in range(3)]
    with gateway(replies) as (d, up):
        cwd = start(d, "thrifty", "tokens_per_day = 120", 3)
        suspended = wait_event(
            d, "thrifty", "lifecycle.changed", match=lambda r: r["data"]["to"] == "suspended"
        )
        assert suspended["data"]["reason"] == "budget: tokens_per_day: 100 of 120 used"
        got = results(cwd)
        assert [r.get("text") for r in got[:2]] == ["r0", "r1"]
        # the SDK raised the refusal: Anthropic's error shape, a 429
        assert got[2]["error"] == 429
        assert got[2]["body"]["type"] == "error"
        assert "tokens_per_day" in got[2]["body"]["error"]["message"]
        assert up.count == 2  # the refused call never went upstream
        (spent,) = d.json("log", "thrifty", "--type", "budget.exhausted")
        assert spent["data"] == {"budget": "tokens_per_day", "limit": 120, "used": 100}
        shown = d.json("show", "thrifty")
        assert shown["state"] == "suspended"
        models = d.json("models")
        assert models["sessions"][0]["tokens"] == 100
        assert models["providers"]  # a gateway's whole view
        assert models["waits"]
        fits(models, ModelsReply)
        shown = d.ctl("models", check=True).stdout
        assert "anthropic-test" in shown
        assert "100/120" in shown  # its tokens today of its daily budget
        # what was spent is read from the log: after a restart the budget still holds
        d.stop()
        d.start()
        d.ctl("resume", "thrifty", check=True)
        d.ctl("activate", "thrifty")
        again = wait_event(
            d, "thrifty", "lifecycle.changed", since=suspended["seq"] + 1,
            match=lambda r: r["data"]["to"] == "suspended",
        )  # fmt: skip
        assert again["data"]["reason"] == "budget: tokens_per_day: 100 of 120 used"
        assert up.count == 2


def call_past_the_agents_budget(d: Daemon) -> None:
    """A new session of the agent makes two calls: the first fits, the second
    would pass the day's budget only with what ``first`` spent."""
    cwd = start(d, "second", "", 2, agent="scribe")
    suspended = wait_event(
        d, "second", "lifecycle.changed", match=lambda r: r["data"]["to"] == "suspended"
    )
    assert suspended["data"]["reason"].startswith(
        "budget: agent_cost_usd_per_day: $0.00054 of $0.0004 used (agent scribe"
    )
    got = results(cwd)
    assert got[0]["text"] == "r1"
    assert got[1]["error"] == 429


def test_an_agents_daily_cost_counts_all_its_sessions() -> None:
    config = "\n[agents.scribe.budget]\ncost_usd_per_day = 0.0004\n"
    replies = [Reply.of(text(f"r{i}"), input_tokens=40, output_tokens=10) for i in range(4)]
    with gateway(replies, config) as (d, up):
        # 40 in and 10 out at $3 and $15 a million: $0.00027 a call
        start(d, "first", "", 1, agent="scribe")
        wait_event(d, "first", "run.finished")
        call_past_the_agents_budget(d)
        assert up.count == 2
        agents = {a["agent"]: a for a in d.json("models")["agents"]}
        assert agents["scribe"]["sessions"] == 2
        assert agents["scribe"]["cost_usd_per_day"] == 0.0004
