"""A 429 storm: twenty sessions wake at once against an upstream that allows 5
calls at once and 60 a minute. The gateway absorbs the 429s (no program sees
one), serves the calls in priority order, and shares fairly between sessions of
equal priority. Asserted on the order the upstream saw, never on times."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from sessiond.gateway.scripted import Reply, Upstream, text
from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for
from tests.e2e.webclient import logged_in
from tests.gateway.rig import ANTHROPIC_KEY

BURST = Path(__file__).parent / "programs" / "burst.py"
BANDS = (80, 60, 40, 20)  # five sessions each
CALLS = 2  # each session's calls, sent at once
# the gateway may send one more than the upstream takes: the storm (429s) follows
CONFIG = """
max_running = 20
aging = "1h"
[web]
listen = "127.0.0.1:0"
[[model.provider]]
name = "up"
kind = "anthropic"
base_url = "{url}"
key_env = "GW_TEST_ANTHROPIC_KEY"
models = ["claude-*"]
concurrency = 6
"""
SPEC = """name = "{name}"
priority = {priority}
[run]
kind = "sdk"
exec = ["{python}", "{program}"]
cwd = "{cwd}"
env = {{ BURST_CALLS = "{calls}" }}
[model]
allow = ["claude-*"]
"""
# calls dispatched by the gateway in one go may reach the upstream in any order
WINDOW = 3


def sessions() -> dict[str, int]:
    return {f"s{p}{c}": p for p in BANDS for c in "abcde"}


def asked(body: dict[str, Any]) -> str:
    content = body["messages"][0]["content"]
    return content if isinstance(content, str) else content[0]["text"]


@pytest.mark.timeout(600)
def test_a_429_storm_is_absorbed_in_priority_order_and_fairly() -> None:
    root = short_dir()
    held = [Reply.of(text("held"), hold=True) for _ in range(5)]
    with Upstream(held, concurrency=5, rpm=60, retry_after=0.5) as up:
        d = Daemon(root, CONFIG.format(url=up.url), env={"GW_TEST_ANTHROPIC_KEY": ANTHROPIC_KEY})
        try:
            d.start()
            folders = {}
            for name, priority in sessions().items():
                cwd = root / f"ws-{name}"
                cwd.mkdir()
                cwd.chmod(0o777)
                folders[name] = cwd
                spec = SPEC.format(name=name, priority=priority, python=sys.executable,
                                   program=BURST, cwd=cwd, calls=CALLS)  # fmt: skip
                d.ctl("create", str(d.write_spec(name, spec)), check=True)
            for name in sessions():
                d.ctl("activate", name, check=True)
            total = len(sessions()) * CALLS
            # five calls held upstream, the sixth answered 429 and queued again, and
            # the gateway sends no more while those five are held (it learned)
            queue = wait_for(
                lambda: (q := d.json("models")["queue"]) and len(q) == total - 5 and q,
                240,
                "every call to wait for the model behind the five held upstream",
            )
            assert up.count == 6
            assert up.counts()["throttled"] == 1
            planned = [(q["session"], q["priority"]) for q in queue]
            # the queue as the gateway shows it: by priority, sessions taking turns
            assert [p for _, p in planned] == sorted((p for _, p in planned), reverse=True)
            for band in BANDS:
                order = [s for s, p in planned if p == band]
                firsts = {s: order.index(s) for s in order}
                seconds = [i for i, s in enumerate(order) if i != firsts[s]]
                assert not seconds or max(firsts.values()) < min(seconds), order
            ps = {r["name"]: r for r in d.json("ps")}
            behind = queue[-1]["session"]
            first = next(q for q in queue if q["session"] == behind)
            assert ps[behind]["reason"] == f"waiting for model: {first['ahead']} ahead"
            assert d.json("show", behind)["model_ahead"] == first["ahead"]
            # the console's page of the session, and /metrics, say the same
            console = logged_in(d)
            page = console.get(f"/s/{behind}").body.decode()
            assert f"waiting for model: {first['ahead']} ahead" in page
            metrics = console.get("/metrics").body.decode()
            assert f'sessiond_model_queue_depth{{provider="up"}} {total - 5}.0' in metrics
            assert 'sessiond_model_throttles_total{provider="up"} 1.0' in metrics
            assert 'sessiond_model_in_flight{provider="up"} 5.0' in metrics
            up.release()
            for name in sessions():
                wait_event(d, name, "run.finished", timeout=240)
            # no 429 reached a program: every call got its answer
            for name, cwd in folders.items():
                results = [json.loads(x) for x in (cwd / "results.jsonl").read_text().splitlines()]
                assert len(results) == CALLS
                for r in results:
                    assert "error" not in r, (name, r)
                    assert r["text"] in ("held", f"echo: {r['asked']}")
            counts = up.counts()
            assert counts["served"] == total
            assert counts["max_active"] <= 5
            # the order the upstream saw the waiting calls in (a retried call counts
            # where it first came): the gateway's order, up to calls sent together
            seen: list[str] = []
            for _path, body in up.requests[6:]:
                if asked(body) not in seen:
                    seen.append(asked(body))
            session_of = [s.split("#")[0] for s in seen]
            waiting = [s for s, _ in planned]
            assert sorted(session_of) == sorted(waiting)
            rank = sessions()
            got = [rank[s] for s in session_of]
            for i, p in enumerate(got):
                assert all(q <= p for q in got[i + WINDOW :]), (i, got)
            for band in BANDS:
                order = [s for s in session_of if rank[s] == band]
                firsts = {s: order.index(s) for s in order}
                seconds = [i for i, s in enumerate(order) if i != firsts[s]]
                # equal priority: each session's first waiting call before any second
                assert not seconds or max(firsts.values()) < min(seconds) + WINDOW, order
            models = d.json("models")
            (provider,) = models["providers"]
            assert provider["throttles"] >= 1
            assert models["queue"] == []
        finally:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
            shutil.rmtree(root, ignore_errors=True)
