"""The codex kind's pieces that are logic: the CLI's config the driver writes, its
command line, the hook's mapping of Codex tools to risk contracts, and the hook
failing closed. The CLI itself runs in tests/e2e/test_codex.py."""

from __future__ import annotations

import io
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sessiond.errors import InvalidInput
from sessiond.integrations.codex import Driver, config_toml
from sessiond.integrations.codex_hook import codex_risk, main
from sessiond.table.spec import parse_spec


def test_the_config_names_the_gateway_as_the_only_provider_and_the_hooks() -> None:
    text = config_toml("http://127.0.0.1:9/run/s/r1/v1", ["/py thon", "-m", "hook"])
    config = tomllib.loads(text)
    assert config["model_provider"] == "sessiond"
    provider = config["model_providers"]["sessiond"]
    assert provider["base_url"] == "http://127.0.0.1:9/run/s/r1/v1"
    assert provider["env_key"] == "OPENAI_API_KEY"  # the run's token, never a key
    assert provider["wire_api"] == "responses"
    assert provider["request_max_retries"] == provider["stream_max_retries"] == 0
    assert config["sandbox_mode"] == "danger-full-access"
    assert config["approval_policy"] == "never"
    assert config["features"]["hooks"] is True
    for event, which in (("PreToolUse", "pre"), ("PostToolUse", "post")):
        [group] = config["hooks"][event]
        [hook] = group["hooks"]
        assert group["matcher"] == "*"
        # quoted for the shell, and a hook that cannot start blocks the call
        assert hook["command"].startswith(f"'/py thon' '-m' 'hook' {which} || {{")
        assert hook["command"].endswith("exit 2; }")
        assert hook["timeout"] >= 86400


def test_resume_comes_before_the_options_and_the_thread_before_the_prompt(
    tmp_path: Path,
) -> None:
    class FakeRun:
        run_id = "r3"

    driver = Driver(FakeRun(), {"model": "gpt-x", "cli": "/bin/codex"}, tmp_path)  # type: ignore[arg-type]
    fresh = driver.argv("do it", None)
    assert fresh[:2] == ["/bin/codex", "exec"]
    assert fresh[-1] == "do it"
    assert "--model" in fresh
    assert "--dangerously-bypass-hook-trust" in fresh
    resumed = driver.argv("-dash first", "thread-1")
    assert resumed[:3] == ["/bin/codex", "exec", "resume"]
    assert resumed[-3:] == ["thread-1", "--", "-dash first"]


def test_codex_tools_take_the_risk_of_their_claude_code_kin() -> None:
    assert codex_risk("Bash")["side_effect"] == "external-write"
    assert codex_risk("Bash")["resume"] == "never-rerun"
    assert codex_risk("apply_patch")["side_effect"] == "workspace-write"
    assert codex_risk("mcp__srv__tool")["side_effect"] == "external-write"


def test_a_hook_that_cannot_ask_the_daemon_blocks_the_call(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SESSIOND_SOCKET", "SESSIOND_TOKEN", "SESSIOND_AGENT_RUNDIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"tool_name": "Bash"}')))
    assert main(["hook", "pre"]) == 2  # exit 2: the CLI blocks the call
    assert "sessiond's tool hook failed" in capsys.readouterr().err


def test_a_hook_fed_garbage_blocks_the_call() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sessiond.integrations.codex_hook", "pre"],
        input=b"not json", capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert b"hook failed" in done.stderr


def test_a_codex_table_needs_the_codex_kind(tmp_path: Path) -> None:
    good = parse_spec(
        'name = "c"\n[run]\nkind = "codex"\n[codex]\nmodel = "gpt-x"\n', base=tmp_path
    )
    assert good.run is not None
    assert good.run.exec[-2:] == ["-m", "sessiond.integrations.codex"]
    with pytest.raises(InvalidInput, match=r'\[codex\] configures a run of kind "codex"'):
        parse_spec('name = "c"\n[run]\nkind = "sdk"\nexec = ["x"]\n[codex]\n', base=tmp_path)
