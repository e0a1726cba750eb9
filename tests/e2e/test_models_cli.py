"""`sessionctl models`: today's spend per session and agent, read from the logs
(so a restart keeps it), and what it says with no provider configured."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.e2e.harness import Daemon, running, wait_event

CHATTER = Path(__file__).parent / "programs" / "chatter.py"
ROOT = Path(__file__).parents[2]
SPEC = """name = "{name}"
agent = "writer"
[run]
kind = "sdk"
exec = ["{python}", "{chatter}"]
cwd = "."
env = {{ PYTHONPATH = "{root}", CHAT_CALLS = "3", CHAT_BYTES = "10" }}
"""
CONFIG = """
[agents.writer.budget]
tokens_per_day = 1000
cost_usd_per_day = 2.5
"""


def talk(d: Daemon, name: str) -> None:
    text = SPEC.format(name=name, python=sys.executable, chatter=CHATTER, root=ROOT)
    d.ctl("create", str(d.write_spec(name, text)), check=True)
    d.ctl("activate", name, check=True)
    done = wait_event(d, name, "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
    assert done["data"]["outcome"] == "completed"


def spend(d: Daemon) -> dict[str, Any]:
    answer = d.json("models")
    return {
        "sessions": {r["session"]: (r["agent"], r["tokens"]) for r in answer["sessions"]},
        "agents": {
            a["agent"]: (a["sessions"], a["tokens"], a["tokens_per_day"]) for a in answer["agents"]
        },
        "gateway": answer["gateway"],
        "queue": answer["queue"],
    }


def test_models_shows_todays_spend_and_keeps_it_over_a_restart() -> None:
    with running(CONFIG) as d:
        talk(d, "one")
        talk(d, "two")
        # chatter's replies say 10 tokens in and 2 out, three replies each
        before = spend(d)
        assert before["sessions"] == {"one": ("writer", 36), "two": ("writer", 36)}
        assert before["agents"] == {"writer": (2, 72, 1000)}
        assert before["gateway"] is False
        assert before["queue"] == []
        text = d.ctl("models", check=True).stdout
        assert "no model providers" in text
        assert "72/1000" in text  # the agent's tokens today of its daily budget
        d.stop()
        d.start()
        assert spend(d) == before  # from the logs, not from memory
