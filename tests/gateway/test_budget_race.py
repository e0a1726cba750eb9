"""Calls sent at once cannot race past a budget: each call in flight holds what it
may still spend (its input and the output it caps), so a call that would pass the
budget with them waits for them to settle and is judged on what they spent. Five
calls sent together spend what the same five sent one after another spend."""

from __future__ import annotations

import json
import sys

from sessiond.gateway.scripted import Reply, text
from tests.e2e.harness import wait_event, wait_for
from tests.gateway.rig import CLIENT, gateway, results
from tests.gateway.test_budget_e2e import SPEC

CALL = {"api": "messages", "stream": False, "text": "go"}  # max_tokens 100 (gwclient)


def test_calls_sent_at_once_spend_no_more_than_one_after_another() -> None:
    # every reply held at the upstream until the test lets go: without holds, all
    # five would be there at once, each judged on nothing spent yet
    replies = [Reply.of(text(f"r{i}"), input_tokens=40, output_tokens=10, hold=True)
               for i in range(5)]  # fmt: skip
    with gateway(replies) as (d, up):
        cwd = d.root / "ws-racer"
        cwd.mkdir()
        cwd.chmod(0o777)
        (cwd / "plan.json").write_text(json.dumps({"calls": [CALL] * 5, "parallel_first": True}))
        spec = SPEC.format(name="racer", agent="", python=sys.executable, client=CLIENT,
                           cwd=cwd, budget="tokens_per_run = 120")  # fmt: skip
        d.ctl("create", str(d.write_spec("racer", spec)), check=True)
        d.ctl("activate", "racer", check=True)

        def waits() -> int:
            return sum(1 for line in d.lines if line.get("event") == "gateway.budget_wait")

        # the five calls are all at the gateway: at the upstream, or waiting there
        # for the one in flight to settle
        wait_for(lambda: up.count >= 5 or (up.count >= 1 and waits() >= 4), 60, "calls")
        up.release()
        suspended = wait_event(
            d, "racer", "lifecycle.changed", match=lambda r: r["data"]["to"] == "suspended"
        )
        # one after another: 0+21 and 50+21 tokens fit 120, 100+21 not (as in
        # test_budget_e2e, where they are sent one after another)
        assert up.count == 2
        assert suspended["data"]["reason"] == "budget: tokens_per_run: 100 of 120 used"
        got = results(cwd)
        assert sorted(str(r.get("text") or r.get("error")) for r in got) == [
            "429", "429", "429", "r0", "r1"
        ]  # fmt: skip
        assert sum(r["data"]["tokens_in"] + r["data"]["tokens_out"]
                   for r in d.json("log", "racer", "--type", "model.responded")) == 100  # fmt: skip
