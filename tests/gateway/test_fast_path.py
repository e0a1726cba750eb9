"""The gateway sends a call upstream while its request is being recorded
(sessiond/runs/asking.py): what that must not change.

- A call whose request cannot be recorded is answered with an error in the
  provider's shape, and nothing of it (no ``model.responded``) is in the log; the
  next call, once the daemon can write again, goes through and is recorded.
- Many sessions calling at once (their calls' ids are the same: ``r1.m1``...) each
  get their own answers, and each log has its calls' requests before their
  responses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.e2e.harness import Daemon, wait_event
from tests.gateway.rig import gateway, session
from tests.gateway.test_refusals import anthropic_shape, held, post, release

BURST = Path(__file__).parent / "programs" / "burst.py"

__all__ = ["held"]  # the fixture, shared with test_refusals


def call(base: str, key: str, text: str) -> tuple[int, Any]:
    body = {"model": "claude-ok", "max_tokens": 5, "messages": [{"role": "user", "content": text}]}
    return post(base + "/v1/messages", json.dumps(body).encode(), key)


def test_a_call_whose_request_cannot_be_recorded_gets_no_answer_and_leaves_no_response(
    held: tuple[Daemon, Any, dict[str, str], Path],
) -> None:
    d, up, env, cwd = held
    base, key = env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"]
    artifacts = d.state_dir / "sessions" / "held" / "artifacts"
    # a symlink in place of the session's artifacts folder: the store refuses to
    # write through it, so the request's context cannot be stored
    kept = artifacts.with_name("artifacts.kept")
    os.rename(artifacts, kept)
    os.symlink(kept, artifacts)
    try:
        status, body = call(base, key, "not recorded")
    finally:
        artifacts.unlink()
        os.rename(kept, artifacts)
    assert status == 500
    assert "could not be recorded" in anthropic_shape(body, "api_error")
    assert d.json("log", "held", "--type", "model.requested") == []
    assert d.json("log", "held", "--type", "model.responded") == []
    # it was sent meanwhile (a model call changes nothing: a later run asks it again)
    assert up.count == 1

    # the daemon writes again: the next call is answered and recorded, in order
    status, body = call(base, key, "recorded")
    assert status == 200, body
    events = d.json("log", "held", "--type", "model.requested", "--type", "model.responded")
    assert [e["type"] for e in events] == ["model.requested", "model.responded"]
    assert {e["data"]["request_id"] for e in events} == {"r1.m2"}  # m1 was not recorded
    assert up.count == 2
    release(cwd)


def test_many_sessions_calling_at_once_each_get_their_own_answers_in_log_order() -> None:
    names = [f"c{i}" for i in range(8)]
    with gateway() as (d, up):
        folders = {}
        for name in names:
            folders[name] = session(d, name, [], allow=["claude-*"], program=BURST)
        for name in names:
            d.ctl("activate", name, check=True)
        for name in names:
            wait_event(d, name, "run.finished", timeout=120)
        for name, cwd in folders.items():
            got = [json.loads(line) for line in (cwd / "results.jsonl").read_text().splitlines()]
            # each call's own answer (the scripted upstream echoes the text asked)
            assert sorted(r.get("text", r) for r in got) == [
                f"echo: {name}#1",
                f"echo: {name}#2",
            ], got
            events = d.json("log", name, "--type", "model.requested", "--type", "model.responded")
            order = [(e["type"], e["data"]["request_id"]) for e in events]
            assert sorted(order) == [
                ("model.requested", "r1.m1"),
                ("model.requested", "r1.m2"),
                ("model.responded", "r1.m1"),
                ("model.responded", "r1.m2"),
            ]
            for call_id in ("r1.m1", "r1.m2"):
                assert order.index(("model.requested", call_id)) < order.index(
                    ("model.responded", call_id)
                )
        assert up.count == 2 * len(names)
