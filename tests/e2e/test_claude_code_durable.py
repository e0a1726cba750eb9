"""`kind = "claude-code"`: the CLI's reported cost on the events, and a kill -9 of
the daemon in the middle of a CLI run. Against the real CLI and the real daemon,
the model a scripted endpoint (tests/agents/anthropic_stub.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest

from tests.agents.anthropic_stub import Endpoint, Turn, text, tool
from tests.e2e.harness import Daemon, running, wait_event, wait_for
from tests.e2e.test_claude_code import CLI, _env, _events, _state, _tool_results

pytestmark = pytest.mark.timeout(400)

# A model the pinned CLI knows the list price of ($3 per million input tokens,
# $15 per million output tokens): the cost it reports is exact.
MODEL = "claude-sonnet-4-5"


def _spec(ws: Path, *, allow: str, prompt: str, ask: str = "") -> str:
    return f"""name = "cc"
goal = "keep notes"
[run]
kind = "claude-code"
cwd = "{ws}"
timeout = "5m"
retries = 0
[claude_code]
prompt = "{prompt}"
allowed_tools = [{allow}]
model = "{MODEL}"
max_turns = 10
cli = "{CLI}"
[policy]
allow = [{allow}]
ask = [{ask}]
[[trigger]]
type = "message"
"""


def _transcript_costs(d: Daemon) -> list[float]:
    """The CLI's own running totals: the cost states in the last stored transcript."""
    last = [e for e in _events(d, "tool.finished")
            if e["data"]["tool"] == "claude-code.transcript"][-1]  # fmt: skip
    digest = last["data"]["result_ref"]["ref"].removeprefix("sha256:")
    found = [p for p in (d.state_dir / "sessions" / "cc").rglob(digest) if p.is_file()]
    assert found, f"no artifact {digest} under {d.state_dir}"
    lines = [orjson.loads(raw) for raw in found[0].read_bytes().splitlines()
             if b'"cost-state"' in raw]  # fmt: skip
    return [float(x["totalCostUSD"]) for x in lines]


def test_each_cli_run_puts_its_own_cost_on_its_last_reply_and_show_sums_it(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [
        Turn(text("First."), input_tokens=1000, output_tokens=500),
        # the next wake resumes the CLI's session, whose total counts the first run too
        Turn(text("Second."), input_tokens=2000, output_tokens=100),
    ]
    with Endpoint(script) as ep, running(env=_env(ep)) as d:
        d.ctl("create", str(d.write_spec("cc", _spec(ws, allow="", prompt="Hi."))), check=True)
        d.ctl("activate", "cc", check=True)
        wait_for(lambda: _state(d) == "sleeping" and len(ep.requests) == 1, 120, "turn 1")
        d.ctl("send", "cc", "Again?", check=True)
        wait_event(d, "cc", "model.responded", match=lambda r: r["data"]["text"] == "Second.",
                   timeout=120)  # fmt: skip
        wait_for(lambda: _state(d) == "sleeping", 60, "turn 2 ended")
        responded = [e["data"] for e in _events(d, "model.responded")]
        assert [r["text"] for r in responded] == ["First.", "Second."]
        first = 1000 * 3e-6 + 500 * 15e-6
        second = 2000 * 3e-6 + 100 * 15e-6  # this run's alone, not the CLI's running total
        assert responded[0]["cost_usd"] == pytest.approx(first)
        assert responded[1]["cost_usd"] == pytest.approx(second)
        # the same figures as the CLI's own running totals in its transcript
        assert _transcript_costs(d)[-2:] == pytest.approx([first, first + second])
        shown = d.json("show", "cc")
        assert shown["budget_used"]["cost_usd"] == pytest.approx(first + second)
        human = d.ctl("show", "cc", check=True).stdout
        assert f"cost ${first + second:.4f}" in human
        log = d.ctl("log", "cc", "--type", "model.responded", check=True).stdout
        assert f"cost=${second:.4f}" in log


def _price(tokens_in: int, tokens_out: int) -> float:
    return tokens_in * 3e-6 + tokens_out * 15e-6


def test_the_cost_of_a_cli_run_stopped_by_a_question_is_not_lost(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write = {"file_path": str(ws / "b.txt"), "content": "x\n"}
    script = [
        # the CLI is stopped at the question: its run reports no result, no cost
        Turn(tool("Write", **write), input_tokens=1000, output_tokens=500),
        Turn(tool("Write", **write), input_tokens=2000, output_tokens=100),
        Turn(text("Written."), input_tokens=3000, output_tokens=50),
    ]
    with Endpoint(script) as ep, running(env=_env(ep)) as d:
        spec = _spec(ws, allow="", ask='"Write"', prompt="Write b.txt.")
        d.ctl("create", str(d.write_spec("cc", spec)), check=True)
        d.ctl("activate", "cc", check=True)
        wait_event(d, "cc", "approval.requested", timeout=120)
        wait_for(lambda: _state(d) == "blocked", 60, "the session blocked on the question")
        d.ctl("approve", "cc", check=True)
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")
        assert (ws / "b.txt").read_text() == "x\n"
        assert len(ep.requests) == 3
        costs = [e["data"].get("cost_usd") for e in _events(d, "model.responded")]
        assert costs[:2] == [None, None]  # the stream gives no cost per reply
        # the stopped run's reply is counted in the next run's figure, not lost
        everything = _price(1000, 500) + _price(2000, 100) + _price(3000, 50)
        assert costs[2] == pytest.approx(everything)
        assert _transcript_costs(d)[-1] == pytest.approx(everything)
        assert d.json("show", "cc")["budget_used"]["cost_usd"] == pytest.approx(everything)


def _run_processes(home: Path) -> list[int]:
    """Processes of the session's runs (the driver, the CLI, its permission server):
    each has the session's private agent home in its environment."""
    mark = f"SESSIOND_AGENT_HOME={home}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours
        if mark in env:
            pids.append(int(entry.name))
    return pids


def test_a_kill_9_of_the_daemon_mid_run_stops_the_cli_and_resume_continues(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    held = threading.Event()
    append = f"echo ran >> {ws / 'ran.txt'}"
    script = [
        Turn(tool("Bash", command=append, description="note it")),
        # the CLI asks the model again with the tool's result: held there while the
        # daemon is killed
        Turn(text("Never delivered."), held=held),
        # the restarted daemon's run resumes the CLI's session
        Turn(text("Done after the restart.")),
    ]
    with Endpoint(script) as ep, running(env=_env(ep)) as d:
        spec = _spec(ws, allow='"Bash"', prompt="Note that you ran.")
        d.ctl("create", str(d.write_spec("cc", spec)), check=True)
        d.ctl("activate", "cc", check=True)
        wait_event(d, "cc", "tool.finished", match=lambda r: r["data"]["tool"] == "Bash",
                   timeout=120)  # fmt: skip
        wait_for(lambda: len(ep.requests) == 2, 120, "the CLI asked the model again")
        home = d.state_dir / "agents" / "cc"
        cut_off = set(_run_processes(home))
        assert len(cut_off) >= 2, "the driver and the CLI are up"
        assert len(_events(d, "run.started")) == 1
        before_kill = int(d.json("show", "cc")["seq"])

        d.kill9()
        d.start()
        # supervision: the run that was cut off (the driver, the CLI waiting for the
        # model) is stopped, never left running beside the next one
        wait_for(lambda: not cut_off & set(_run_processes(home)), 120,
                 "the cut-off run's processes stopped")  # fmt: skip
        # the session comes back through replay and the resume gate, and its turn
        # goes on: a new run resumes the CLI's session
        wait_event(d, "cc", "model.responded",
                   match=lambda r: r["data"]["text"] == "Done after the restart.",
                   timeout=180)  # fmt: skip
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")
        held.set()

        assert (ws / "ran.txt").read_text() == "ran\n"  # the finished call never reran
        bash = [e for e in _events(d, "tool.started") if e["data"]["tool"] == "Bash"]
        assert len(bash) == 1
        gates = [e["data"] for e in _events(d, "gate.evaluated")
                 if e["seq"] > before_kill and not e["data"]["dry_run"]]  # fmt: skip
        assert gates, "the restart gated the session before its next run"
        assert all(g["ok"] for g in gates), gates
        runs = _events(d, "run.started")
        assert len(runs) == 2
        assert runs[0]["data"]["turn"] == runs[1]["data"]["turn"]  # the same turn
        finished = {e["data"]["run"]: e["data"]["status"] for e in _events(d, "run.finished")}
        assert finished[runs[1]["data"]["run"]] == "ok"
        # --resume: the CLI sent the conversation so far, the tool's result in it
        last = ep.requests[-1]
        assert len(ep.requests) == 3
        assert "Note that you ran." in repr(last["messages"])
        assert any(b.get("tool_use_id") == script[0].blocks[0]["id"] for b in _tool_results(last))
        responded = [e["data"]["text"] for e in _events(d, "model.responded")]
        assert "Never delivered." not in responded
        assert not _run_processes(home)
