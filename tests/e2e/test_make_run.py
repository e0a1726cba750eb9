"""What `make run` shows (issue 16's "done when"): config/sessiond.toml and
config/sessions/ as shipped, with the real daemon and sessionctl: the console
and /metrics, a notice in state/notices.jsonl (no network needed) whose signed
approve link runs the deploy session once, and a trace exported from the log."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import orjson

from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for
from tests.e2e.test_links import ended, free_port, use

SHIPPED = Path(__file__).parents[2] / "config"


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
