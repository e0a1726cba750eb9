"""The model gateway through a real daemon: the official SDKs in a real run call
the three APIs, streamed and not; every call is a durable step of the turn, and a
later run of the turn gets the recorded responses with no upstream call."""

from __future__ import annotations

from typing import Any

from sessiond.gateway.scripted import Reply, text, tool
from tests.e2e.harness import Daemon, wait_event, wait_for
from tests.gateway.rig import ANTHROPIC_KEY, OPENAI_KEY, gateway, results, session

READ = {
    "name": "Read",
    "description": "read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}
SIX = [
    {"api": "messages", "stream": False, "text": "a"},
    {"api": "messages", "stream": True, "text": "b", "tools": [READ]},
    {"api": "chat", "stream": False, "text": "c"},
    {"api": "chat", "stream": True, "text": "d"},
    {"api": "responses", "stream": False, "text": "e"},
    {"api": "responses", "stream": True, "text": "f"},
]
SCRIPT = [
    Reply.of(text("plain"), input_tokens=11, output_tokens=3),
    Reply.of(text("let me look"), tool("Read", path="a.txt"), input_tokens=12, output_tokens=4),
    Reply.of(tool("get_weather", city="Oslo"), input_tokens=13, output_tokens=5),
    Reply.of(text("streamed chat"), stop="max_tokens", input_tokens=14, output_tokens=6),
    Reply.of(text("a response"), input_tokens=15, output_tokens=7),
    Reply.of(text("then"), tool("shell", cmd="ls"), input_tokens=16, output_tokens=8),
]
EXPECTED = [
    {"text": "plain", "stop": "end_turn", "usage": [11, 3], "tools": []},
    {"text": "let me look", "stop": "tool_use", "usage": [12, 4],
     "tools": [["Read", {"path": "a.txt"}]]},
    {"text": "", "stop": "tool_calls", "usage": [13, 5],
     "tools": [["get_weather", {"city": "Oslo"}]]},
    {"text": "streamed chat", "stop": "length", "usage": [14, 6], "tools": []},
    {"text": "a response", "stop": "completed", "usage": [15, 7], "tools": []},
    {"text": "then", "stop": "completed", "usage": [16, 8], "tools": [["shell", {"cmd": "ls"}]]},
]  # fmt: skip


def finished(d: Daemon, name: str) -> Any:
    return wait_for(
        lambda: (
            d.json("show", name)["state"] in ("terminated", "sleeping", "failed")
            and d.json("show", name)
        ),
        60,
        f"{name} to end its run",
    )


def test_the_three_apis_streamed_and_not_through_the_sdks_and_recorded() -> None:
    with gateway(SCRIPT) as (d, up):
        cwd = session(d, "six", SIX)
        d.ctl("activate", "six", check=True)
        wait_event(d, "six", "run.finished", timeout=60)
        got = [{k: r.get(k) for k in ("text", "stop", "usage", "tools")} for r in results(cwd)]
        assert got == EXPECTED
        assert up.count == 6
        # the providers' keys went upstream, from the daemon
        assert up.keys == [ANTHROPIC_KEY] * 2 + [OPENAI_KEY] * 4
        requested = d.json("log", "six", "--type", "model.requested")
        responded = d.json("log", "six", "--type", "model.responded")
        assert [r["data"]["key"] for r in requested] == [f"gw.{n}" for n in range(1, 7)]
        assert [r["data"]["model"] for r in requested] == ["claude-test"] * 2 + ["gpt-test"] * 4
        assert [r["data"]["tool_count"] for r in requested] == [0, 1, 0, 0, 0, 0]
        assert len(requested[1]["data"]["tools_sha256"]) == 64
        assert [(r["data"]["tokens_in"], r["data"]["tokens_out"]) for r in responded] == [
            tuple(e["usage"]) for e in EXPECTED
        ]
        assert all(r["data"]["status"] == "ok" for r in responded)
        # priced where the provider says its prices (per million tokens)
        assert responded[0]["data"]["cost_usd"] == (11 * 3.0 + 3 * 15.0) / 1e6
        assert responded[2]["data"]["cost_usd"] is None
        assert responded[1]["data"]["text"] == "let me look"


def test_a_later_run_of_the_turn_is_answered_from_the_log_in_the_same_shape() -> None:
    with gateway(SCRIPT) as (d, up):
        cwd = session(d, "again", SIX, retries=1, fail_once=True)
        d.ctl("activate", "again", check=True)
        # the first run fails after its six calls; the retry runs the same turn again
        wait_event(d, "again", "run.finished", match=lambda r: r["data"].get("run") != "r1",
                   timeout=90)  # fmt: skip
        runs = results(cwd)
        assert len(runs) == 12
        first = [{k: r.get(k) for k in ("text", "stop", "usage", "tools")} for r in runs[:6]]
        second = [{k: r.get(k) for k in ("text", "stop", "usage", "tools")} for r in runs[6:]]
        assert first == EXPECTED
        assert second == EXPECTED  # streamed and parsed as the first time
        assert up.count == 6  # and not one call went upstream again
        assert len(d.json("log", "again", "--type", "model.responded")) == 6


def test_a_changed_request_is_answered_from_the_log_or_diverges_where_the_spec_says() -> None:
    plan = [{"api": "chat", "stream": True, "text": "at 10:00", "text_again": "at 10:05"}]
    with gateway([Reply.of(text("plain"))]) as (d, up):
        # frameworks put timestamps in requests: by default the record answers
        cwd = session(d, "loose", plan, retries=1, fail_once=True)
        d.ctl("activate", "loose", check=True)
        wait_event(d, "loose", "run.finished", match=lambda r: r["data"].get("run") != "r1",
                   timeout=90)  # fmt: skip
        assert [r.get("text") for r in results(cwd)] == ["plain", "plain"]
        assert up.count == 1
        requested = d.json("log", "loose", "--type", "model.requested")
        assert [r["data"]["replayed"] for r in requested] == [False, True]
        assert requested[0]["data"]["request_sha256"] != requested[1]["data"]["request_sha256"]

        # [model] strict: the changed request is a divergence, and nothing is sent
        cwd = session(d, "strict", plan, retries=1, fail_once=True, strict=True)
        up.add(Reply.of(text("strictly")))
        d.ctl("activate", "strict", check=True)
        wait_event(d, "strict", "gate.evaluated", match=lambda r: r["data"].get("divergence"),
                   timeout=90)  # fmt: skip
        # (blocked once its run ended: the program wrote what it got by then)
        wait_for(lambda: d.json("show", "strict")["state"] == "blocked", 60, "strict blocked")
        assert up.count == 2
        got = results(cwd)
        assert got[0]["text"] == "strictly"
        assert got[1]["error"] == 400
        assert "--discard" in got[1]["body"]["message"]  # the divergence, and what to do


def test_calls_sent_at_once_find_their_own_records_in_any_order() -> None:
    calls = [{"api": "chat", "text": t} for t in ("red", "green", "blue")]
    plan = {"calls": calls, "parallel_first": True, "reverse_again": True}
    with gateway() as (d, up):  # the upstream echoes each request's text
        cwd = session(d, "racing", plan, retries=1, fail_once=True)
        d.ctl("activate", "racing", check=True)
        wait_event(d, "racing", "run.finished", match=lambda r: r["data"].get("run") != "r1",
                   timeout=90)  # fmt: skip
        got = results(cwd)
        assert [r["text"] for r in got[3:]] == ["echo: blue", "echo: green", "echo: red"]
        assert sorted(r["text"] for r in got[:3]) == ["echo: blue", "echo: green", "echo: red"]
        assert up.count == 3
