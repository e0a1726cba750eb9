"""Every example in examples/, woken through its declared trigger by the real daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.harness import Daemon, running, short_dir, wait_event
from tests.e2e.test_triggers import wait_line

EXAMPLES = Path(__file__).parents[2] / "examples"


def copy(d: Daemon, name: str) -> Path:
    target = d.root / name
    shutil.copytree(EXAMPLES / name, target)
    return target


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def types(d: Daemon, name: str) -> list[str]:
    return [r["type"] for r in d.json("log", name)]


def settled(d: Daemon, name: str, since: int = 1) -> dict[str, Any]:
    """Wait until ``name`` rests (sleeping, blocked or terminated, from ``since`` on)
    and return its ``show``: the end state its README promises."""
    wait_event(
        d, name, "lifecycle.changed", since=since,
        match=lambda r: r["data"]["to"] in ("sleeping", "blocked", "terminated"),
    )  # fmt: skip
    shown: dict[str, Any] = d.json("show", name)
    return shown


def runs(d: Daemon, name: str, since: int = 1) -> list[dict[str, Any]]:
    """The runs of ``name`` that finished, from ``since`` on (a fork's own: after its fork)."""
    return [r["data"] for r in d.json("log", name, "--type", "run.finished") if r["seq"] >= since]


def test_api_docs_regenerates_on_a_commit_to_src_only() -> None:
    with running() as d:
        example = copy(d, "api-docs")
        project = example / "project"
        git(project, "init", "-q", "-b", "main")
        git(project, "add", ".")
        git(project, "commit", "-q", "-m", "first")
        d.ctl("create", str(example / "api-docs.toml"), check=True)
        assert d.json("show", "api-docs")["next_wake"] == "on commit to src/**"
        (project / "README.md").write_text("# Shop\nmore\n")
        git(project, "commit", "-q", "-am", "readme only")
        wait_line(d, "git.ignored")  # seen, and it did not wake the session
        with (project / "src" / "shop" / "__init__.py").open("a") as f:
            f.write('\n\ndef refund(order_id: int) -> None:\n    """Refund an order."""\n')
        before = git(project, "rev-parse", "HEAD")
        git(project, "commit", "-q", "-am", "add refund")
        after = git(project, "rev-parse", "HEAD")
        wait_event(d, "api-docs", "run.finished")
        wakes = d.json("log", "api-docs", "--type", "wake.requested")
        assert len(wakes) == 1  # the README-only commit did not wake it
        assert wakes[0]["data"]["details"]["range"] == f"{before}..{after}"
        assert "## `shop.refund(order_id)`" in (project / "docs" / "api.md").read_text()
        chain = types(d, "api-docs")
        start = chain.index("tool.intent")
        assert chain[start : start + 3] == ["tool.intent", "policy.decided", "tool.started"]
        finished = d.json("log", "api-docs", "--type", "tool.finished")[0]["data"]
        assert finished["diff"] is not None  # docs/api.md changed: the diff is kept
        intent = d.json("log", "api-docs", "--type", "tool.intent")[0]["data"]
        assert intent["risk"]["resume"] == "rerun-after-check"
        assert intent["writes"] == ["docs/api.md"]
        # the end state: armed again, one run (the src/ commit's), which went well
        shown = settled(d, "api-docs", since=finished_seq(d, "api-docs"))
        assert (shown["state"], shown["next_wake"]) == ("sleeping", "on commit to src/**")
        assert [r["status"] for r in runs(d, "api-docs")] == ["ok"]


def finished_seq(d: Daemon, name: str) -> int:
    seq: int = d.json("log", name, "--type", "run.finished")[-1]["seq"]
    return seq


def test_payroll_reruns_on_new_rates_and_catches_up_a_missed_month() -> None:
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        example = copy(d, "payroll")
        d.ctl("create", str(example / "payroll.toml"), check=True)
        rates = example / "rates.csv"
        rates.write_text(rates.read_text().replace("45.00", "47.50"))
        finished = wait_event(d, "payroll", "run.finished")
        assert finished["data"]["status"] == "ok"
        assert "ann,7600.00" in (example / "payroll.csv").read_text()
        assert (example / "payroll.log").read_text().split() == ["dependency"]
        shown = settled(d, "payroll", since=finished["seq"])
        assert shown["state"] == "sleeping"
        assert [r["status"] for r in runs(d, "payroll")] == ["ok"]  # one run, the new rates'
        d.stop()
        d.config.write_text('log_format = "json"\nclock_offset = 3456000\n')  # 40 days on
        d.start()
        caught_up = wait_event(d, "payroll", "run.finished", since=finished["seq"] + 1)
        assert (example / "payroll.log").read_text().split() == ["dependency", "cron"]
        cron = d.json("log", "payroll", "--type", "wake.requested")[-1]["data"]
        assert cron["details"]["catch_up"] is True
        # caught up once, then asleep until the next 1st
        assert settled(d, "payroll", since=caught_up["seq"])["state"] == "sleeping"
        assert [r["status"] for r in runs(d, "payroll")] == ["ok", "ok"]
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_fix_tests_asks_before_its_edit_then_fixes_and_verifies() -> None:
    with running() as d:
        example = copy(d, "fix-tests")
        spec = example / "fix-tests.toml"
        root = Path(__file__).parents[2]
        text = spec.read_text().replace('exec = ["python3"', f'exec = ["{sys.executable}"')
        text = text.replace('timeout = "5m"', f'timeout = "5m"\nenv = {{ PYTHONPATH = "{root}" }}')
        spec.write_text(text)
        d.ctl("create", str(spec), check=True)
        d.ctl("send", "fix-tests", "please fix the tests", check=True)
        blocked = wait_event(
            d, "fix-tests", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert blocked["data"]["reason"].startswith("approval pending for edit_file")
        assert "a - b" in (example / "project" / "calc.py").read_text()
        d.ctl("approve", "fix-tests", check=True)
        done = wait_event(
            d, "fix-tests", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        assert done["data"]["outcome"] == "completed"
        assert d.json("show", "fix-tests")["state"] == "terminated"
        assert "a + b" in (example / "project" / "calc.py").read_text()
        log: list[dict[str, Any]] = d.json("log", "fix-tests")
        wake = next(r for r in log if r["type"] == "wake.requested")
        assert wake["data"]["trigger"] == "message"
        model = next(r for r in log if r["type"] == "model.requested")["data"]
        assert model["model"] == "scripted-coder-1"
        # one model request in the whole turn: the run after the approval got the
        # recorded response back
        assert len([r for r in log if r["type"] == "model.responded"]) == 1
        assert len([r for r in log if r["type"] == "run.started"]) == 2
        tests_run = [
            r for r in log if r["type"] == "tool.started" and r["data"]["tool"] == "run_tests"
        ]
        assert len(tests_run) == 1
        assert (
            d.state_dir / "sessions" / "fix-tests" / "artifacts" / model["context"]["ref"][7:]
        ).is_file()
        responded = next(r for r in log if r["type"] == "model.responded")["data"]
        assert responded["tokens_in"] > 0
        edit = [
            r["type"] for r in log if r.get("correlation") and r["data"].get("tool") == "edit_file"
        ]
        assert edit[:3] == ["tool.intent", "policy.decided", "approval.requested"]
        assert "approval.granted" in edit
        assert edit[-3:] == ["tool.started", "tool.finished", "observation.projected"]
        assert [r["data"]["ok"] for r in log if r["type"] == "verification.finished"] == [True]


def test_handoff_forks_a_child_that_reports_back_and_is_merged() -> None:
    """As its README runs it: the child runs once, reports once, is merged; the
    parent ends asleep, both its runs ok (it ended blocked after 4 failed runs: the
    child also ran for a message after going on with the forked turn, and sent
    "done" twice; the second merge failed)."""
    with running() as d:
        example = copy(d, "handoff")
        d.ctl("create", str(example / "handoff.toml"), check=True)
        d.ctl("activate", "handoff", check=True)
        merged = wait_event(d, "handoff", "session.merged", timeout=60)
        assert merged["data"]["child"] == "handoff-side"
        child = d.json("show", "handoff-side")
        assert (child["state"], child["outcome"], child["parent"]) == (
            "terminated",
            "merged",
            "handoff",
        )
        # the parent's run that merged ends, and it rests: asleep, waiting for messages
        parent = settled(d, "handoff", since=merged["seq"])
        assert (parent["state"], parent["reason"]) == ("sleeping", "last run: exit 0")
        assert [(r["run"], r["status"]) for r in runs(d, "handoff")] == [("r1", "ok"), ("r2", "ok")]
        fork = d.json("log", "handoff-side", "--type", "session.forked")[0]
        forked, at = fork["seq"], fork["data"]["at_seq"]
        assert len(runs(d, "handoff-side", since=forked)) == 1  # its one run after the fork
        # the parent's command, open at the fork, is not called interrupted in the child
        closed = d.json("log", "handoff-side", "--type", "observation.projected")[0]["data"]
        assert closed["text"] == (
            f"command had not finished in handoff when this session was forked from it at "
            f"seq {at}; this session goes on with that turn, and it is safe to run again"
        )
        reports = [
            r["data"]["text"]
            for r in d.json("log", "handoff", "--type", "message.received")
            if r["data"]["sender"] == "handoff-side"
        ]
        assert reports == ["done: 2 links checked"]
        assert (example / "side-result.txt").read_text() == "2 links checked\n"
        view = d.json("replay", "handoff", "--view", "messages")
        assert any(
            m["content"] == "[merged from handoff-side] side quest: 2 links checked" for m in view
        )
        assert any(m.get("sender") == "handoff-side" for m in view)
