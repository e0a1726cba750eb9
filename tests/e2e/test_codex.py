"""`kind = "codex"` against the real Codex CLI and the real daemon.

The CLI is `@openai/codex` installed by `make agents` into tests/agents/node_modules;
its model calls go through the daemon's gateway to the scripted upstream on
loopback (sessiond.gateway.scripted, its Responses route), which counts what it
receives. The CLI, its JSON stream, its hooks and `codex exec resume` are the
real ones.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sessiond.gateway.scripted import Reply, Upstream, text, tool
from sessiond.replies import JsonObject
from tests.e2e.harness import Daemon, running, wait_event, wait_for

CLI = Path(__file__).resolve().parent.parent / "agents" / "node_modules" / ".bin" / "codex"

if not CLI.exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"{CLI} is missing: `make agents` installs it (Node.js and npm)")
    pytest.skip(
        f"the Codex CLI is not installed at {CLI}: `make agents` installs it "
        "(needs Node.js and npm)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.timeout(400)


KEY = "sk-openai-test-0123456789-never-in-a-run"
PROVIDER = """
[[model.provider]]
name = "openai-test"
kind = "openai"
base_url = "{url}/v1"
key_env = "CX_TEST_OPENAI_KEY"
models = ["gpt-*"]
price_in = 2.0
price_out = 8.0
"""


@contextmanager
def codex_daemon(script: list[Reply]) -> Iterator[tuple[Daemon, Upstream]]:
    """A scripted upstream, and a daemon whose gateway sends to it."""
    with (
        Upstream(script) as up,
        running(PROVIDER.format(url=up.url), env={"CX_TEST_OPENAI_KEY": KEY}) as d,
    ):
        yield d, up


def shell(cmd: str) -> JsonObject:
    """A call of Codex's shell tool (``exec_command``; its hooks name it Bash)."""
    return tool("exec_command", cmd=cmd)


def said(*blocks: JsonObject) -> Reply:
    return Reply.of(*blocks, input_tokens=100, output_tokens=20)


def _bodies(up: Upstream) -> list[dict[str, Any]]:
    return [body for path, body in up.requests if path == "/v1/responses"]


def _spec(ws: Path, *, allow: str = "", ask: str = "", deny: str = "", budget: str = "") -> str:
    return f"""name = "cx"
goal = "keep notes"
[run]
kind = "codex"
cwd = "{ws}"
timeout = "5m"
retries = 0
[codex]
prompt = "Note it in log.txt."
model = "gpt-test"
cli = "{CLI}"
[model]
allow = ["gpt-test"]
[budget]
{budget}
[policy]
allow = [{allow}]
ask = [{ask}]
deny = [{deny}]
[[trigger]]
type = "message"
"""


def _events(d: Daemon, etype: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = d.json("log", "cx", "--type", etype)
    return out


def _state(d: Daemon) -> str:
    return str(d.json("show", "cx")["state"])


def _run_processes(home: Path) -> list[int]:
    """Processes of the session's runs (the driver, the CLI, its hooks): each has the
    session's private agent home in its environment."""
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


def _outputs(request: dict[str, Any]) -> list[str]:
    return [
        str(i.get("output"))
        for i in request.get("input") or []
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]


def test_a_shell_call_asks_a_person_and_runs_once_after_the_approval(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    append = f"echo noted >> {ws / 'log.txt'}"
    script = [
        said(text("Noting it."), shell(append)),
        # the run after the approval resumes the CLI's thread: the model asks again
        said(shell(append)),
        said(text("Noted.")),
        # the next wake: the thread goes on
        said(text("Still here.")),
    ]
    with codex_daemon(script) as (d, up):
        d.ctl("create", str(d.write_spec("cx", _spec(ws, ask='"Bash"'))), check=True)
        d.ctl("activate", "cx", check=True)
        asked = wait_event(d, "cx", "approval.requested", timeout=120)
        assert asked["data"]["tool"] == "Bash"
        wait_for(lambda: _state(d) == "blocked", 60, "the session blocked on the question")
        assert not (ws / "log.txt").exists()  # nothing ran before a person said yes
        assert up.count == 1

        d.ctl("approve", "cx", check=True)
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")
        assert (ws / "log.txt").read_text() == "noted\n"  # approved once, run once
        started = [e for e in _events(d, "tool.started") if e["data"]["tool"] == "Bash"]
        assert len(started) == 1
        finished = [e["data"] for e in _events(d, "tool.finished") if e["data"]["tool"] == "Bash"]
        assert finished[0]["status"] == "ok"
        # the resumed thread was told of the approval
        assert "approved your call to Bash" in repr(_bodies(up)[1]["input"])
        # every model call went through the gateway: on record, none answered from an
        # earlier run's place (the resumed thread's calls are new ones)
        responded = _events(d, "model.responded")
        assert len(responded) == up.count == 3
        assert all(r["data"]["model"] == "gpt-test" for r in responded)
        assert d.json("show", "cx")["budget_used"]["tokens"] == 3 * 120

        d.ctl("send", "cx", "Anything else?", check=True)
        wait_for(lambda: up.count == 4 and _state(d) == "sleeping", 120, "turn 2")
        flat = repr(_bodies(up)[3]["input"])
        assert "Note it in log.txt." in flat  # the same thread: its history is sent
        assert "Anything else?" in flat


def test_a_denied_shell_call_is_blocked_and_the_model_reads_why(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [said(shell(f"echo no > {ws / 'c.txt'}")), said(text("Could not."))]
    with codex_daemon(script) as (d, up):
        d.ctl("create", str(d.write_spec("cx", _spec(ws, deny='"Bash"'))), check=True)
        d.ctl("activate", "cx", check=True)
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")
        assert not (ws / "c.txt").exists()
        assert up.count == 2
        assert "denied by sessiond" in " ".join(_outputs(_bodies(up)[1]))
        decided = [e["data"] for e in _events(d, "policy.decided") if e["data"]["tool"] == "Bash"]
        assert decided[0]["decision"] == "deny"
        assert not [e for e in _events(d, "tool.started") if e["data"]["tool"] == "Bash"]


def test_a_kill_9_of_the_daemon_mid_turn_resumes_the_thread_and_runs_nothing_twice(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    append = f"echo ran >> {ws / 'ran.txt'}"
    script = [
        said(shell(append)),
        # the CLI asks the model again with the call's output: held there (mid-stream)
        # while the daemon is killed
        Reply.of(text("Never delivered."), hold=True),
        # the restarted daemon's run resumes the CLI's thread
        said(text("Done after the restart.")),
    ]
    with codex_daemon(script) as (d, up):
        d.ctl("create", str(d.write_spec("cx", _spec(ws, allow='"Bash"'))), check=True)
        d.ctl("activate", "cx", check=True)
        wait_event(d, "cx", "tool.finished", match=lambda r: r["data"]["tool"] == "Bash",
                   timeout=120)  # fmt: skip
        assert up.wait_count(2) == 2, "the CLI asked the model again"
        home = d.state_dir / "agents" / "cx"
        cut_off = set(_run_processes(home))
        assert cut_off, "the driver and the CLI are up"
        for pid in cut_off:  # the driver, the CLI: the run's token, never the key
            with contextlib.suppress(OSError):
                assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        before_kill = int(d.json("show", "cx")["seq"])

        d.kill9()
        d.start()
        # nothing of the cut-off run is left beside the next one
        wait_for(lambda: not cut_off & set(_run_processes(home)), 120,
                 "the cut-off run's processes stopped")  # fmt: skip
        wait_for(lambda: up.count == 3 and _state(d) == "sleeping", 180, "the turn ended")

        assert (ws / "ran.txt").read_text() == "ran\n"  # the finished call never reran
        assert len([e for e in _events(d, "tool.started") if e["data"]["tool"] == "Bash"]) == 1
        gates = [e["data"] for e in _events(d, "gate.evaluated")
                 if e["seq"] > before_kill and not e["data"]["dry_run"]]  # fmt: skip
        assert gates, "the restart gated the session before its next run"
        assert all(g["ok"] for g in gates), gates
        runs = _events(d, "run.started")
        assert len(runs) == 2
        assert runs[0]["data"]["turn"] == runs[1]["data"]["turn"]  # the same turn
        # `codex exec resume`: the thread's history, the call's output in it, is sent
        last = _bodies(up)[-1]
        assert "Note it in log.txt." in repr(last["input"])
        call_id = script[0].blocks[0]["id"]
        outputs = [i for i in last["input"] if i.get("type") == "function_call_output"]
        assert [o["call_id"] for o in outputs] == [call_id]
        assert not _run_processes(home)


def test_its_calls_count_against_the_budget_and_one_past_it_suspends_the_session(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [
        # $0.0028 at the provider's prices: past the turn's budget once spent
        Reply.of(shell(f"echo ran >> {ws / 'ran.txt'}"), input_tokens=1000, output_tokens=100),
        said(text("Never asked for.")),
    ]
    with codex_daemon(script) as (d, up):
        spec = _spec(ws, allow='"Bash"', budget="cost_usd_per_turn = 0.001")
        d.ctl("create", str(d.write_spec("cx", spec)), check=True)
        d.ctl("activate", "cx", check=True)
        wait_for(lambda: _state(d) == "suspended", 120, "the session suspended")
        shown = d.json("show", "cx")
        assert "cost_usd_per_turn" in shown["reason"], shown["reason"]
        assert (ws / "ran.txt").read_text() == "ran\n"
        assert up.count == 1  # the call past the budget never reached the upstream
        assert len(_events(d, "model.responded")) == 1
        assert shown["budget_used"]["cost_usd"] == pytest.approx(1000 * 2e-6 + 100 * 8e-6)
        exhausted = _events(d, "budget.exhausted")
        assert [e["data"]["budget"] for e in exhausted] == ["cost_usd_per_turn"]


def test_a_command_no_hook_allowed_stops_the_cli_and_fails_the_run(tmp_path: Path) -> None:
    """The CLI runs a tool unasked when its hooks do not run (untrusted, disabled,
    broken): the driver stops it at the first such command and fails the run."""
    ws = tmp_path / "ws"
    ws.mkdir()
    wrapper = tmp_path / "codex-without-hooks"
    run_cli = f'exec "{CLI}" "$first" --disable hooks "$@"'
    wrapper.write_text(f'#!/bin/sh\nfirst="$1"; shift\n{run_cli}\n')
    wrapper.chmod(0o755)
    script = [said(shell(f"echo one >> {ws / 'ran.txt'}")), said(text("Done."))]
    with codex_daemon(script) as (d, up):
        spec = _spec(ws, allow='"Bash"').replace(f'cli = "{CLI}"', f'cli = "{wrapper}"')
        d.ctl("create", str(d.write_spec("cx", spec)), check=True)
        d.ctl("activate", "cx", check=True)
        finished = wait_event(d, "cx", "run.finished", timeout=120)
        assert finished["data"]["status"] == "failed"
        err = d.ctl("output", "cx", "--stderr", check=True).stdout
        assert "codex ran a call no hook allowed" in err
        assert not _events(d, "tool.started")  # nothing of it is a step: it was never asked
        assert up.count == 1  # stopped before it could ask the model again


def test_a_run_without_a_network_still_reaches_the_model_through_the_gateway(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [said(shell(f"echo ran >> {ws / 'ran.txt'}")), said(text("Done."))]
    with codex_daemon(script) as (d, up):
        spec = _spec(ws, allow='"Bash"').replace("retries = 0\n", 'retries = 0\nnetwork = "none"\n')
        d.ctl("create", str(d.write_spec("cx", spec)), check=True)
        d.ctl("activate", "cx", check=True)
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")
        assert (ws / "ran.txt").read_text() == "ran\n"
        assert up.count == len(_events(d, "model.responded")) == 2
        assert d.json("show", "cx")["boundary"]["network"] == "none"


def test_a_fork_resumes_the_thread_from_the_stored_rollout(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [said(text("Parent here.")), said(text("Child here."))]
    with codex_daemon(script) as (d, up):
        d.ctl("create", str(d.write_spec("cx", _spec(ws))), check=True)
        d.ctl("activate", "cx", check=True)
        wait_event(d, "cx", "tool.finished", timeout=120,
                   match=lambda r: r["data"]["tool"] == "codex.transcript")  # fmt: skip
        wait_for(lambda: _state(d) == "sleeping", 60, "turn 1 ended")
        d.ctl("fork", "cx", "--as", "kid", "--with-triggers", check=True)
        d.ctl("send", "kid", "And you?", check=True)
        wait_for(lambda: d.json("show", "kid")["state"] == "sleeping" and up.count == 2, 120,
                 "the child's turn")  # fmt: skip
        flat = repr(_bodies(up)[1]["input"])
        # the child's CLI had the parent's thread: restored, then `codex exec resume`
        assert "Note it in log.txt." in flat
        assert "Parent here." in flat
        assert "And you?" in flat
        kid_home = d.state_dir / "agents" / "kid"
        assert (kid_home / "thread-id").read_text() == (
            d.state_dir / "agents" / "cx" / "thread-id"
        ).read_text()


def test_without_a_gateway_a_codex_run_refuses_to_start_the_cli(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    # a daemon with no provider: a key and an address in its environment would
    # otherwise reach the CLI, its calls unrecorded and unbudgeted
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "sk-not-for-runs"}
    with running(env=env) as d:
        d.ctl("create", str(d.write_spec("cx", _spec(ws))), check=True)
        d.ctl("activate", "cx", check=True)
        finished = wait_event(d, "cx", "run.finished", timeout=120)
        assert finished["data"]["status"] == "failed"
        err = d.ctl("output", "cx", "--stderr", check=True).stdout
        assert "add a [[model.provider]]" in err
        assert not (d.state_dir / "agents" / "cx" / "thread-id").exists()  # no CLI ran
