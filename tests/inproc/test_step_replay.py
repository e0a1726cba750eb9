"""Durable steps replayed in process: what a later run of the turn gets back, and
what it never does again (moved from tests/e2e/test_steps_attack.py; what needs
a real process there stays: a program that dies, a kill -9, a timeout, a stop,
threads and asyncio). The programs are the same sources, run by the real SDK in
a thread (``FakeRun.source``); work is counted in ``<name>.count`` files."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from sessiond.wire import RemoteError
from tests.e2e.test_steps_attack import EXPORT_MID_TURN, POLICY
from tests.inproc.harness import Harness
from tests.inproc.test_step_identity import lines, program, seq, settled, to

KEYED_THEN_DIVERGE = """
with connect() as run:
    run.step("pay", lambda: count("pay"), key="pay")           # a keyed step, placed first
    first = Path("plan.txt").read_text().strip()
    run.step(first, lambda: count(first), **SAFE)               # ordinal 1
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


MODEL_TWICE = """
import json
with connect() as run:
    stamp = Path("stamp.txt").read_text()             # a framework's timestamp
    got = run.model_call("m-1", {"q": "hi", "ts": stamp},
                         lambda: count("model") and {"say": "hi"}, strict=STRICT)
    Path("model.seen").open("a").write(json.dumps(got) + "\\n")
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


VALUES = """
import hashlib, json
with connect() as run:
    blob = run.step("blob", lambda: count("blob") and bytes(range(256)) * 100, **SAFE)
    big = run.step("big", lambda: count("big") and {"rows": list(range(5000))}, **SAFE)
    refy = run.step("refy", lambda: count("refy") and {"ref": "sha256:" + "a" * 64}, **SAFE)
    tup = run.step("tup", lambda: count("tup") and (1, "two", None), **SAFE)
    seen = [hashlib.sha256(blob).hexdigest(), type(blob).__name__, len(big["rows"]), refy, tup]
    Path("values.seen").open("a").write(json.dumps(seen) + "\\n")
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


SEND_TO_NOBODY = """
from sessiond.sdk import RemoteError
with connect() as run:
    try:
        run.send("nobody-here", "hello?")
    except RemoteError as exc:
        Path("send.err").write_text(exc.code)
    run.step("pay", lambda: count("pay"))
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


async def test_accepting_a_divergence_does_not_rerun_a_keyed_step_taken_before_it(
    h: Harness,
) -> None:
    """A keyed step is recorded with the ordinal of the *next* unkeyed step, and
    ``resolve --accept`` dropped every step at or past the divergence: a keyed step
    taken before the divergent one was dropped too, and paid again."""
    (h.root / "plan.txt").write_text("look\n")
    await program(h, KEYED_THEN_DIVERGE, policy=POLICY)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    (h.root / "plan.txt").write_text("peek\n")  # the next run takes another path at 1
    since = await seq(h) + 1
    await h.call("approve", name="agent")
    blocked = await h.event("agent", "lifecycle.changed", to("blocked"), after=since - 1)
    assert "step 1" in blocked["data"]["reason"]
    await h.idle()
    assert lines(h, "pay") == 1
    since = await seq(h) + 1
    await h.call("resolve", name="agent", option="accept")
    await h.event("agent", "lifecycle.changed", to("blocked"), after=since - 1)  # edit asks
    await h.idle()
    await h.call("approve", name="agent")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert (lines(h, "look"), lines(h, "peek"), lines(h, "edits")) == (1, 1, 1)
    assert lines(h, "pay") == 1  # taken before step 1: it is not on the new path


@pytest.mark.parametrize("strict", [False, True])
async def test_a_model_step_is_never_sent_twice_even_when_its_request_changes(
    h: Harness, strict: bool
) -> None:
    """The request changes between runs of the turn (a timestamp): without strict
    the recorded response is answered and no second request is sent; with strict it
    is a divergence, and still nothing is sent."""
    (h.root / "stamp.txt").write_text("t1")
    await program(h, MODEL_TWICE.replace("STRICT", str(strict)), policy=POLICY)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    (h.root / "stamp.txt").write_text("t2")
    since = await seq(h) + 1
    await h.call("approve", name="agent")
    if strict:
        blocked = await h.event("agent", "lifecycle.changed", to("blocked"), after=since - 1)
        assert "model 'm-1'" in blocked["data"]["reason"]
        await h.idle()
        assert lines(h, "model") == 1
        assert lines(h, "edits") == 0
        return
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert (lines(h, "model"), lines(h, "edits")) == (1, 1)
    seen = (h.root / "model.seen").read_text().splitlines()
    assert seen == ['{"say": "hi"}', '{"say": "hi"}']
    asked = await h.log("agent", types=["model.requested"])
    assert [r["data"].get("replayed", False) for r in asked] == [False, True]
    assert len(await h.log("agent", types=["model.responded"])) == 1
    assert (await h.call("show", name="agent"))["state"] == "terminated"


async def test_a_fork_of_a_session_blocked_mid_turn_is_not_blocked_on_its_parents_question(
    h: Harness,
) -> None:
    """A fork of a session blocked on an approval mid-turn kept the parent's pending
    question. The fork goes on with the parent's open turn (its finished steps
    replayed to the fork, never redone) and asks its own question; the parent is
    untouched: it pays once and its approval is its own."""
    await program(h, EXPORT_MID_TURN, policy=POLICY)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    await h.call("fork", name="agent", new="kid")
    assert (await h.call("show", name="kid"))["pending_approvals"] == []
    pending = (await h.call("show", name="agent"))["pending_approvals"]
    assert [a["tool"] for a in pending] == ["edit_file"]
    await h.call("approve", name="agent")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert (lines(h, "pay"), lines(h, "model"), lines(h, "edits-agent")) == (1, 1, 1)
    await h.call("activate", name="kid")
    blocked = await h.event("kid", "lifecycle.changed", to("blocked"))
    assert blocked["data"]["reason"].startswith("approval pending for edit_file")
    await h.idle()
    # the fork goes on with the parent's open turn, as a forked process goes on from
    # where its parent was: the parent's finished steps are replayed, not redone
    assert [r["data"]["turn"] for r in await h.log("kid", types=["run.started"])] == [1, 1]
    await h.call("approve", name="kid")
    await h.event("kid", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert lines(h, "edits-kid") == 1
    assert lines(h, "edits-agent") == 1
    assert (lines(h, "pay"), lines(h, "model")) == (1, 1)  # nothing finished ran twice


async def test_bytes_big_and_ref_shaped_results_replay_exactly(h: Harness) -> None:
    """Bytes (stored as an artifact), a result past the inline size, a result that
    looks like an artifact reference and a tuple: the replay after an approval gives
    every run the very same values, and no step ran twice."""
    await program(h, VALUES, policy=POLICY)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    await h.call("approve", name="agent")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert [lines(h, k) for k in ("blob", "big", "refy", "tup", "edits")] == [1, 1, 1, 1, 1]
    first, second = (h.root / "values.seen").read_text().splitlines()
    assert first == second
    got: list[Any] = orjson.loads(first)
    assert got[1] == "bytes"
    assert got[3] == {"ref": "sha256:" + "a" * 64}
    assert got[4] == [1, "two", None]


async def test_a_send_to_no_session_is_refused_before_it_is_a_step(h: Harness) -> None:
    """A send to a session that does not exist was recorded as a failed unsafe step,
    so the run after the approval was blocked for a person though nothing had been
    sent. It is refused before anything is recorded."""
    await program(h, SEND_TO_NOBODY, policy=POLICY)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    assert (h.root / "send.err").read_text() == "no_such_session"
    intents = [r["data"]["tool"] for r in await h.log("agent", types=["tool.intent"])]
    assert "send" not in intents
    await h.call("approve", name="agent")
    done = await h.event("agent", "lifecycle.changed", to("terminated"))
    assert done["data"]["outcome"] == "completed"
    await h.idle()
    assert (lines(h, "pay"), lines(h, "edits")) == (1, 1)


ACTIVATE_BLOCKED = """
with connect() as run:
    run.step("pay", lambda: count("pay"))
    run.step("charge", lambda: count("charge") and 1 / 0, side_effect="external-write")
    run.complete()
"""


KEYED_DIVERGE = """
import threading
with connect() as run:
    run.step("look", lambda: count("look"), **SAFE)                   # ordinal 1
    which = Path("plan.txt").read_text().strip()
    done = []
    def worker(k, name):
        done.append(run.step(name, lambda: count(name + "-" + k), key=k, **SAFE))
    threads = [threading.Thread(target=worker, args=("a", "fetch")),
               threading.Thread(target=worker, args=("b", which))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.step("pay", lambda: count("pay"))                              # ordinal 2
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


async def test_activate_while_blocked_runs_no_finished_or_failed_step_again(h: Harness) -> None:
    """A failed unsafe step blocks the turn; activate (again and again) leaves it
    blocked and runs nothing; --rerun (a person) runs the failed step once more, and
    the paid one is replayed."""
    await program(h, ACTIVATE_BLOCKED, policy=POLICY, run="retries = 3")
    await h.call("activate", name="agent")
    assert await settled(h) == "blocked"
    assert (lines(h, "pay"), lines(h, "charge")) == (1, 1)
    for _ in range(3):
        try:
            said = str(await h.call("activate", name="agent"))
        except RemoteError as exc:
            said = str(exc)
        assert "blocked" in said, said
    await h.idle()
    assert (await h.call("show", name="agent"))["state"] == "blocked"
    assert (lines(h, "pay"), lines(h, "charge")) == (1, 1)
    assert len(await h.log("agent", types=["run.started"])) == 1
    since = await seq(h) + 1
    await h.call("resolve", name="agent", option="rerun")
    await h.event("agent", "run.finished", after=since - 1)
    assert await settled(h) == "blocked"  # it failed again: blocked again, not retried
    assert (lines(h, "pay"), lines(h, "charge")) == (1, 2)


async def test_accepting_a_divergence_at_a_keyed_step_takes_only_that_step_anew(
    h: Harness,
) -> None:
    """The divergence is at a keyed step (a thread asked for another tool under its
    key): after --accept that step runs on the new path; its keyed sibling and the
    steps before are replayed; the steps after it (pay) are on the new path."""
    (h.root / "plan.txt").write_text("peek\n")
    await program(h, KEYED_DIVERGE, policy=POLICY)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    assert (lines(h, "fetch-a"), lines(h, "peek-b"), lines(h, "pay")) == (1, 1, 1)
    (h.root / "plan.txt").write_text("grep\n")
    since = await seq(h) + 1
    await h.call("approve", name="agent")
    blocked = await h.event("agent", "lifecycle.changed", to("blocked"), after=since - 1)
    assert "'grep'" in blocked["data"]["reason"]
    await h.idle()
    since = await seq(h) + 1
    await h.call("resolve", name="agent", option="accept")
    await h.event("agent", "lifecycle.changed", to("blocked"), after=since - 1)
    await h.idle()
    await h.call("approve", name="agent")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert (lines(h, "look"), lines(h, "fetch-a")) == (1, 1)
    assert (lines(h, "peek-b"), lines(h, "grep-b")) == (1, 1)
    # pay came after the divergent step (ordinal 2, after the threads): on the new
    # path it is the program's to do again, as the person accepted that path
    assert lines(h, "pay") == 2
    # the main thread went on after the divergence and its *approved* edit was
    # started although the run had been told to stop; the accept then dropped it
    # as on the new path, and it ran a second time
    assert lines(h, "edits") == 1
