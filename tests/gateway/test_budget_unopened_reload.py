"""An agent's daily budget given by a reload while a call waits for the calls in
flight counts the agent's sessions not opened yet too, those whose index entry
cannot say what they spent included (an index written before entries had
``spend``): they are opened before the call is admitted, whether the agent had a
daily budget when the call came or not. The test-only hold ``fault_hold =
"open-late"`` keeps the background load from opening anything after
``daemon.ready`` until a file exists; nothing waits on time."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import orjson

from sessiond.gateway.scripted import Reply, text
from tests.e2e.harness import wait_event, wait_for
from tests.gateway.rig import CLIENT, gateway, results
from tests.gateway.test_budget_e2e import SPEC, start

CALL = {"api": "messages", "stream": False, "text": "go"}  # max_tokens 100 (gwclient)
UNLIMITED = "\n[agents.scribe]\n"
LIMITED = "\n[agents.scribe.budget]\ncost_usd_per_day = 0.0004\n"


def test_a_daily_budget_reloaded_during_a_wait_counts_an_unopened_session() -> None:
    hold = Path(tempfile.mkdtemp(prefix="sd-go-"))
    go = hold / "go"
    # 40 in and 10 out at $3 and $15 a million: $0.00027 a call
    replies = [Reply.of(text("r0"), input_tokens=40, output_tokens=10)]
    replies += [Reply.of(text(f"r{i}"), input_tokens=40, output_tokens=10, hold=True)
                for i in (1, 2)]  # fmt: skip
    try:
        with gateway(replies, UNLIMITED) as (d, up):
            start(d, "first", "", 1, agent="scribe")
            wait_event(d, "first", "run.finished")
            d.stop()
            # an index written before entries had ``spend``: "first" cannot be
            # counted from its entry
            path = d.state_dir / "table.index"
            header, *lines = path.read_bytes().splitlines()
            entries = [orjson.loads(line) for line in lines]
            for entry in entries:
                entry.pop("spend", None)
            path.write_bytes(b"\n".join([header, *map(orjson.dumps, entries)]) + b"\n")
            config = d.config.read_text()
            held = f'fault_hold = "open-late"\nfault_hold_until = "{go}"\n'
            d.config.write_text(held + config)
            since = len(d.lines)
            d.start()
            assert d.wait_line("daemon.ready", since=since)["unopened"] == 1

            # two calls at once from a session of the agent, the second waiting for
            # the first (its run's budget cannot hold both in flight)
            cwd = d.root / "ws-racer"
            cwd.mkdir()
            cwd.chmod(0o777)
            plan = {"calls": [CALL] * 2, "parallel_first": True}
            (cwd / "plan.json").write_text(json.dumps(plan))
            spec = SPEC.format(name="racer", agent="scribe", python=sys.executable,
                               client=CLIENT, cwd=cwd, budget="tokens_per_run = 130")  # fmt: skip
            d.ctl("create", str(d.write_spec("racer", spec)), check=True)
            d.ctl("activate", "racer", check=True)

            def waits() -> int:
                return sum(1 for line in d.lines if line.get("event") == "gateway.budget_wait")

            wait_for(lambda: up.count >= 2 and waits() >= 1, 60, "one call sent, one waiting")
            # the agent gets a daily budget meanwhile: "first" spent $0.00027 of it
            d.config.write_text(held + config.replace(UNLIMITED, LIMITED))
            d.ctl("reload", check=True)
            up.release()
            wait_event(d, "racer", "run.finished")
            got = sorted(str(r.get("text") or r.get("error")) for r in results(cwd))
            assert got == ["429", "r1"]  # the waiting call refused
            assert up.count == 2  # first's, then one: the waiting call never went upstream
            suspended = d.json("log", "racer", "--type", "lifecycle.changed")[-1]
            assert suspended["data"]["to"] == "suspended", suspended
            assert suspended["data"]["reason"].startswith(
                "budget: agent_cost_usd_per_day: $0.00054 of $0.0004 used (agent scribe"
            ), suspended
            go.touch()
            d.wait_line("daemon.loaded", since=since)
    finally:
        shutil.rmtree(hold, ignore_errors=True)
