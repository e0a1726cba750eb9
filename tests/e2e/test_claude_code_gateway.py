"""`kind = "claude-code"` through the daemon's model gateway: the real Claude Code
CLI and daemon, the CLI's calls sent to ANTHROPIC_BASE_URL = the gateway's address
for the run, the gateway in front of the scripted upstream (which counts what it
receives). Its calls are the gateway's model.requested / model.responded, counted
against the budgets, and a kill -9 of the daemon mid-turn sends no finished call
again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sessiond.gateway.scripted import Reply, Upstream, text, tool
from tests.e2e.harness import Daemon, running, wait_event, wait_for
from tests.e2e.test_claude_code import CLI, _events, _state
from tests.e2e.test_claude_code_durable import _run_processes

pytestmark = pytest.mark.timeout(400)

KEY = "sk-ant-test-0123456789-never-in-a-run"
PROVIDER = """
[[model.provider]]
name = "anthropic-test"
kind = "anthropic"
base_url = "{url}"
key_env = "CC_TEST_ANTHROPIC_KEY"
models = ["claude-*"]
price_in = 3.0
price_out = 15.0
"""
MODEL = "claude-sonnet-4-5"


@contextmanager
def gateway(script: list[Reply]) -> Iterator[tuple[Daemon, Upstream]]:
    env = {"CC_TEST_ANTHROPIC_KEY": KEY, "CLAUDE_CODE_MAX_RETRIES": "0"}
    with Upstream(script) as up, running(PROVIDER.format(url=up.url), env=env) as d:
        yield d, up


def _spec(ws: Path, *, allow: str = "", ask: str = "", budget: str = "") -> str:
    return f"""name = "cc"
goal = "keep notes"
[run]
kind = "claude-code"
cwd = "{ws}"
timeout = "5m"
retries = 0
[claude_code]
prompt = "Note that you ran."
allowed_tools = [{allow}]
model = "{MODEL}"
max_turns = 10
cli = "{CLI}"
[model]
allow = ["claude-*"]
[policy]
allow = [{allow}]
ask = [{ask}]
[budget]
{budget}
[[trigger]]
type = "message"
"""


def _calls(up: Upstream) -> list[dict[str, Any]]:
    return [body for path, body in up.requests if path == "/v1/messages"]


def said(*blocks: dict[str, Any], tokens_in: int = 1000, tokens_out: int = 100) -> Reply:
    return Reply.of(*blocks, input_tokens=tokens_in, output_tokens=tokens_out)


def test_its_calls_are_the_gateways_model_events_with_cost_and_no_key(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    append = f"echo ran >> {ws / 'ran.txt'}"
    script = [
        said(text("Noting it."), tool("Bash", command=append, description="note it")),
        # the run after the approval resumes the CLI's session: the model asks again
        said(tool("Bash", command=append, description="note it")),
        said(text("Noted.")),
    ]
    with gateway(script) as (d, up):
        d.ctl("create", str(d.write_spec("cc", _spec(ws, ask='"Bash"'))), check=True)
        d.ctl("activate", "cc", check=True)
        wait_event(d, "cc", "approval.requested", timeout=120)
        wait_for(lambda: _state(d) == "blocked", 60, "the session blocked on the question")
        d.ctl("approve", "cc", check=True)
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")
        assert (ws / "ran.txt").read_text() == "ran\n"  # approved once, run once

        requested = _events(d, "model.requested")
        responded = _events(d, "model.responded")
        # each call once, recorded by the gateway (not again by the driver from the
        # CLI's stream), none answered from an earlier run's place
        assert len(requested) == len(responded) == up.count == 3
        assert {r["data"]["model"] for r in responded} == {MODEL}
        assert responded[0]["data"]["text"].startswith("Noting it.")
        # the gateway's cost, at the provider's configured prices
        one = 1000 * 3.0 / 1e6 + 100 * 15.0 / 1e6
        assert [r["data"]["cost_usd"] for r in responded] == pytest.approx([one] * 3)
        shown = d.json("show", "cc")
        assert shown["budget_used"]["tokens"] == 3 * 1100
        assert shown["budget_used"]["cost_usd"] == pytest.approx(3 * one)
        # the CLI called with the run's token, never the provider's key
        for _, body in up.requests:
            assert KEY not in repr(body)
        assert KEY not in d.ctl("log", "cc", "-o", "json").stdout


def test_a_kill_9_mid_turn_sends_no_finished_call_again(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    append = f"echo ran >> {ws / 'ran.txt'}"
    script = [
        said(tool("Bash", command=append, description="note it")),
        # the CLI asks again with the tool's result: held mid-stream while the daemon
        # is killed
        Reply.of(text("Never delivered."), hold=True),
        # the restarted daemon's run resumes the CLI's session
        said(text("Done after the restart.")),
    ]
    with gateway(script) as (d, up):
        d.ctl("create", str(d.write_spec("cc", _spec(ws, allow='"Bash"'))), check=True)
        d.ctl("activate", "cc", check=True)
        wait_event(d, "cc", "tool.finished", match=lambda r: r["data"]["tool"] == "Bash",
                   timeout=120)  # fmt: skip
        assert up.wait_count(2) == 2, "the CLI asked the model again"
        home = d.state_dir / "agents" / "cc"
        cut_off = set(_run_processes(home))
        assert cut_off, "the driver and the CLI are up"

        d.kill9()
        d.start()
        wait_for(lambda: not cut_off & set(_run_processes(home)), 120,
                 "the cut-off run's processes stopped")  # fmt: skip
        wait_event(d, "cc", "model.responded",
                   match=lambda r: r["data"]["text"] == "Done after the restart.",
                   timeout=180)  # fmt: skip
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")

        assert (ws / "ran.txt").read_text() == "ran\n"  # the finished call never reran
        # the upstream saw the finished call once, the cut one, and the resumed one
        assert up.count == 3
        texts = [e["data"]["text"] for e in _events(d, "model.responded")]
        assert "Never delivered." not in texts
        assert len(texts) == 2
        runs = _events(d, "run.started")
        assert len(runs) == 2
        assert runs[0]["data"]["turn"] == runs[1]["data"]["turn"]
        # --resume: the CLI sent the conversation so far, the tool's result in it
        assert "Note that you ran." in repr(_calls(up)[-1]["messages"])


def test_a_call_past_the_budget_is_refused_and_the_session_suspended(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    append = f"echo ran >> {ws / 'ran.txt'}"
    script = [
        # $0.0045 at the provider's prices: past the turn's budget once spent
        said(tool("Bash", command=append, description="note it")),
        said(text("Never asked for.")),
    ]
    with gateway(script) as (d, up):
        spec = _spec(ws, allow='"Bash"', budget="cost_usd_per_turn = 0.001")
        d.ctl("create", str(d.write_spec("cc", spec)), check=True)
        d.ctl("activate", "cc", check=True)
        wait_for(lambda: _state(d) == "suspended", 120, "the session suspended")
        shown = d.json("show", "cc")
        assert "cost_usd_per_turn" in shown["reason"], shown["reason"]
        assert (ws / "ran.txt").read_text() == "ran\n"
        assert up.count == 1  # the call past the budget never reached the upstream
        assert shown["budget_used"]["cost_usd"] == pytest.approx(1000 * 3e-6 + 100 * 15e-6)
        exhausted = _events(d, "budget.exhausted")
        assert [e["data"]["budget"] for e in exhausted] == ["cost_usd_per_turn"]
