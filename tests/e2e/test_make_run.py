"""What `make run` shows (issue 16's "done when"): config/sessiond.toml and
config/sessions/ as shipped, with the real daemon and sessionctl: the console
and /metrics, a notice in state/notices.jsonl (no network needed) whose signed
approve link runs the deploy session once, and a trace exported from the log."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import orjson

from sessiond.gateway.scripted import Upstream
from tests.e2e.harness import BIN, Daemon, short_dir, wait_event, wait_for
from tests.e2e.test_links import ended, free_port, use

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "config"


def tour(curdir: Path) -> list[str]:
    """What `make run` prints before it starts the daemon, for a clone at ``curdir``:
    its ``@echo`` lines, run by the shell as make runs them (the daemon's line is not)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nrun: $(STAMP)\n", 1)[1].split("\n\n", 1)[0]
    echoes = [line[2:] for line in recipe.splitlines() if line.startswith("\t@echo")]
    script = "\n".join(echoes).replace("$(BIN)", ".venv/bin").replace("$(CURDIR)", str(curdir))
    done = subprocess.run(
        ["sh", "-c", script.replace("$$", "$")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_every_command_of_the_make_run_tour_works_as_written() -> None:
    """Each command the tour prints, run as a person would in another terminal (the
    first line's cd and export in force), against the shipped config: exit 0 and
    what its hint promises. The approve link's line printed a "blocked" notice, which
    has no link, and the hint said "an approval's carry links"."""
    root = short_dir()
    upstream = Upstream()  # what `make run` starts on 127.0.0.1:8766, on a free port here
    try:
        upstream.__enter__()
        (root / ".venv").symlink_to(BIN.parent)  # the clone's venv, as `make run` has it
        printed = tour(root)
        assert "carries signed approve and deny links" in " ".join(printed)
        commands = [line[2:].split("    # ")[0] for line in printed if line.startswith("  ")]
        terminal, *commands = commands
        assert terminal == f"cd '{root}' && export SESSIOND_SOCKET='{root}/state/sessiond.sock'"
        d = Daemon(root)
        d.socket = root / "state" / "sessiond.sock"
        port = free_port()
        text = (SHIPPED / "sessiond.toml").read_text()
        text = text.replace('listen = "127.0.0.1:8765"', f'listen = "127.0.0.1:{port}"')
        text = text.replace("http://127.0.0.1:8766", upstream.url)
        d.config.write_text(text.replace('specs = "sessions"', f'specs = "{SHIPPED / "sessions"}"'))
        d.start()
        notices = d.state_dir / "notices.jsonl"
        out: dict[str, str] = {}
        for command in commands:
            if "notices.jsonl" in command:  # a person reads it once the notice is there
                wait_for(lambda: notices.exists() and b"approve_url" in notices.read_bytes())
            if "log ask" in command:  # a person looks once the model has answered
                wait_event(d, "ask", "model.responded", timeout=120)
            line = command.replace("127.0.0.1:8765", f"127.0.0.1:{port}")
            env = {k: v for k, v in d.env.items() if k != "SESSIOND_SOCKET"}
            done = subprocess.run(
                ["sh", "-c", f"{terminal} && {line}"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, f"{command}: {done.stderr}"
            assert done.stdout.strip(), f"{command} printed nothing"
            out[command] = done.stdout

        def printed_by(part: str) -> str:
            return next(o for c, o in out.items() if part in c)

        assert {"hello", "notes", "deploy"} <= set(printed_by("sessionctl ps").split())
        assert "merged side into notes" in printed_by("merge side")
        assert "sessiond_runs_total" in printed_by("curl")
        approve = printed_by("approve_url").strip()
        assert re.fullmatch(rf"http://127\.0\.0\.1:{port}/approvals/deploy/\S+", approve)
        assert use(approve).status == 200  # the page that asks to confirm
        assert use(approve, "POST").status == 200
        finished = wait_event(d, "deploy", "lifecycle.changed", match=ended)
        assert finished["data"]["outcome"] == "completed"
        assert (root / "state" / "hello.otlp.json").is_file()
        # the gateway: its provider, and the ask session's call through it, on record
        assert "scripted" in printed_by("sessionctl models")
        logged = printed_by("log ask")
        assert "model.requested" in logged
        assert "model.responded        scripted-model ok" in logged
        assert upstream.count == 1
        assert d.stop() == 0
    finally:
        upstream.__exit__(None, None, None)
        shutil.rmtree(root, ignore_errors=True)


def test_make_run_shows_the_console_metrics_a_notice_with_links_and_a_trace() -> None:
    root = short_dir()
    try:
        d = Daemon(root)
        text = (SHIPPED / "sessiond.toml").read_text()
        port = free_port()
        text = text.replace('listen = "127.0.0.1:8765"', f'listen = "127.0.0.1:{port}"')
        text = text.replace('specs = "sessions"', f'specs = "{SHIPPED / "sessions"}"')
        d.config.write_text(text)
        d.start()
        assert d.json("web")["console"] == f"http://127.0.0.1:{port}"
        d.ctl("activate", "deploy", check=True)
        wait_event(d, "deploy", "approval.requested")
        notices = d.state_dir / "notices.jsonl"

        def approval_notice() -> dict[str, object] | None:
            if not notices.exists():
                return None
            for line in notices.read_bytes().splitlines():
                notice = orjson.loads(line)
                if notice["event"] == "approval.requested" and notice["session"] == "deploy":
                    return dict(notice)
            return None

        notice = wait_for(approval_notice, what="the deploy's notice in notices.jsonl")
        approve = str(notice["approve_url"])
        assert approve.startswith(f"http://127.0.0.1:{port}/approvals/deploy/")
        assert use(approve, "POST").status == 200
        finished = wait_event(d, "deploy", "lifecycle.changed", match=ended)
        assert finished["data"]["outcome"] == "completed"
        assert [r["type"] for r in d.json("log", "deploy")].count("tool.started") == 1
        [target] = d.json("notify")["targets"]
        assert target["target"] == "demo"
        assert target["state"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as metrics:
            assert b'sessiond_runs_total{outcome="ok"} 1.0' in metrics.read()
        out = root / "deploy.otlp.json"
        d.ctl("trace", "export", "deploy", "-o", str(out), check=True)
        spans = [
            span
            for rs in orjson.loads(out.read_bytes())["resourceSpans"]
            for ss in rs["scopeSpans"]
            for span in ss["spans"]
        ]
        assert any(s["name"] == "execute_tool command" for s in spans), spans
        assert d.stop() == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
