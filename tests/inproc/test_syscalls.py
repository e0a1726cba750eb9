"""Every syscall's effect on the table, through the dispatch table in one process
(moved from tests/e2e/test_syscalls.py; the client's rendering stays there)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from tests.inproc.fakes import FakeRun
from tests.inproc.harness import Harness

HELLO = """name = "hello"
goal = "say hello"
agent = "demo"
priority = 7
[run]
exec = ["true", "hello"]
cwd = "."
[[trigger]]
type = "message"
"""

NOTES = """name = "notes"
goal = "collect notes"
"""

SLOW = """name = "slow"
[run]
exec = ["true", "slow"]
"""


def hello_program(h: Harness) -> None:
    """The e2e test's `echo hello from $SESSIOND_SESSION; echo "$SESSIOND_WAKE" > wake.json`."""

    @h.program("hello")
    async def hello(run: FakeRun) -> int:
        await run.out(f"hello from {run.session}\n")
        (Path(run.cwd) / "wake.json").write_text(run.env["SESSIOND_WAKE"] + "\n")
        return 0


def slow_program(h: Harness) -> asyncio.Event:
    """`trap 'exit 143' TERM; sleep 30 & wait`: runs until stopped; the event says it began."""
    began = asyncio.Event()

    @h.program("slow")
    async def slow(_run: FakeRun) -> int:
        began.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return 143
        return 0

    return began


async def test_ping_says_version_and_sessions(h: Harness) -> None:
    info = await h.call("ping")
    assert info["version"] == "0.1.0"
    assert info["sessions"] == 0


async def test_create_ps_show_and_the_armed_state(h: Harness) -> None:
    hello = await h.create(HELLO, "hello")
    notes = await h.create(NOTES, "notes")
    assert hello["state"] == "sleeping"  # has a trigger: armed from creation
    assert notes["state"] == "created"  # no trigger: waits for activate
    rows = {r["name"]: r for r in await h.call("ps")}
    assert rows["hello"]["next_wake"] == "on message"
    assert rows["hello"]["agent"] == "demo"
    assert rows["hello"]["priority"] == 7
    shown = await h.call("show", name="hello")
    assert shown["goal"] == "say hello"
    again = await h.refused("create", spec=HELLO, base=str(h.root))
    assert again.exit_code == 1
    assert "exists already" in str(again)


async def test_bad_specs_are_refused_naming_the_key(h: Harness) -> None:
    bad = await h.refused(
        "create", spec='name = "bad"\n[run]\nexec = ["x"]\ntimeout = "soon"\n', base=str(h.root)
    )
    assert bad.exit_code == 5
    assert "run.timeout" in str(bad)
    assert "'soon'" in str(bad)
    unknown = await h.refused("create", spec='name = "unk"\ncolour = "red"\n', base=str(h.root))
    assert unknown.exit_code == 5
    assert "colour: unknown key" in str(unknown)


async def test_activate_runs_the_program_and_keeps_its_output(h: Harness) -> None:
    hello_program(h)
    await h.create(HELLO, "hello")
    await h.call("activate", name="hello")
    await h.event("hello", "run.finished")
    await h.idle()
    shown = await h.call("show", name="hello")
    assert shown["state"] == "sleeping"
    assert shown["runs"] == 1
    last = shown["last_run"]
    assert last["status"] == "ok"
    assert last["exit_code"] == 0
    assert h.store.artifacts("hello").get(last["stdout"]["ref"]) == b"hello from hello\n"
    wake = orjson.loads((h.root / "wake.json").read_bytes())
    assert wake["wakes"][0]["trigger"] == "manual"
    assert (await h.types("hello"))[2:] == [
        "wake.requested", "gate.evaluated", "lifecycle.changed",  # -> ready
        "tool.intent", "policy.decided", "tool.started", "lifecycle.changed",  # -> running
        "run.started", "tool.finished", "observation.projected", "run.finished",
        "lifecycle.changed",  # -> sleeping
    ]  # fmt: skip
    observation = (await h.log("hello", types=["observation.projected"]))[0]["data"]
    assert observation["text"] == "exit 0; stdout: hello from hello"


async def test_a_session_without_a_program_cannot_be_activated(h: Harness) -> None:
    await h.create(NOTES, "notes")
    refused = await h.refused("activate", name="notes")
    assert refused.exit_code == 1
    assert "no [run] program" in str(refused)


async def test_send_reaches_the_mailbox_and_wakes_a_message_session(h: Harness) -> None:
    hello_program(h)
    await h.create(HELLO, "hello")
    await h.create(NOTES, "notes")
    sent = await h.call("send", to="notes", text="remember the milk", sender="ann")
    assert sent["woke"] is False
    view = await h.messages("notes")
    assert {"role": "user", "kind": "message", "content": "remember the milk", "seq": sent["seq"],
            "sender": "ann"} in view  # fmt: skip
    sent = await h.call("send", to="hello", text="wake up")
    assert sent["woke"] is True
    finished = await h.event("hello", "run.finished")
    assert finished["data"]["status"] == "ok"
    wake = orjson.loads((h.root / "wake.json").read_bytes())
    assert wake["wakes"][0]["trigger"] == "message"
    assert wake["wakes"][0]["details"]["text"] == "wake up"
    await h.idle()


async def test_compact_shows_the_summary_while_log_keeps_the_originals(h: Harness) -> None:
    await h.create(NOTES, "notes")
    for text in ("first note. more", "second note", "third note", "fourth note"):
        await h.call("send", to="notes", text=text)
    await h.call("compact", name="notes", keep=1)
    view = [m["content"] for m in await h.messages("notes")]
    assert view[0] == "Goal: collect notes"
    assert view[1].startswith("Summary of earlier context (events 2-4): ")
    assert "first note." in view[1]
    assert view[2:] == ["fourth note"]
    texts = [r["data"]["text"] for r in await h.log("notes", types=["message.received"])]
    assert texts == ["first note. more", "second note", "third note", "fourth note"]
    compacted = await h.log("notes", types=["context.compacted"])
    assert compacted[0]["data"]["method"] == "builtin"


async def test_fork_then_merge_puts_the_childs_summary_in_the_parents_view(h: Harness) -> None:
    await h.create(NOTES, "notes")
    await h.call("send", to="notes", text="one")
    await h.call("send", to="notes", text="two")
    child = await h.call("fork", name="notes", new="side", at=2)
    assert child["parent"] == "notes"
    assert child["fork_seq"] == 2
    assert child["state"] == "created"
    parent_log = await h.log("notes")
    child_log = await h.log("side")
    assert child_log[:2] == parent_log[:2]  # same ids, same seqs
    assert child_log[2]["type"] == "session.forked"
    assert (await h.call("show", name="notes"))["children"] == ["side"]
    await h.call("send", to="side", text="found it")
    merged = await h.call("merge", child="side", summary="the answer is 42")
    assert merged["child"]["state"] == "terminated"
    assert merged["child"]["outcome"] == "merged"
    view = await h.messages("notes")
    assert view[-1]["content"] == "[merged from side] the answer is 42"


async def test_fork_does_not_inherit_triggers_unless_asked(h: Harness) -> None:
    await h.create(HELLO, "hello")
    plain = await h.call("fork", name="hello", new="plain")
    assert plain["state"] == "created"
    assert plain["triggers"] == []
    armed = await h.call("fork", name="hello", new="armed", with_triggers=True)
    assert armed["state"] == "sleeping"
    assert armed["triggers"] == ["message"]


async def test_suspend_resume_interrupt_cancel(h: Harness) -> None:
    began = slow_program(h)
    await h.create(NOTES, "notes")
    assert (await h.call("suspend", name="notes"))["state"] == "suspended"
    assert (await h.call("resume", name="notes"))["state"] == "sleeping"
    await h.create(SLOW, "slow")
    await h.call("activate", name="slow")
    await asyncio.wait_for(began.wait(), 60)
    assert (await h.call("show", name="slow"))["pid"]
    assert (await h.call("interrupt", name="slow"))["state"] == "sleeping"
    assert h.session("slow").run is None  # its program is gone
    last = (await h.call("show", name="slow"))["last_run"]
    assert last["status"] == "interrupted"
    began.clear()
    await h.call("activate", name="slow")
    await asyncio.wait_for(began.wait(), 60)
    cancelled = await h.call("cancel", name="slow")
    assert (cancelled["state"], cancelled["outcome"]) == ("terminated", "cancelled")
    assert h.session("slow").run is None


@pytest.mark.parametrize(
    ("setup", "command", "message"),
    [
        ("terminated", "activate", "it is terminated"),
        ("terminated", "suspend", "it is terminated"),
        ("terminated", "cancel", "it is terminated"),
        ("created", "resume", "not suspended"),
        ("created", "interrupt", "only a running session"),
        ("suspended", "suspend", "from suspended a session can only become"),
        ("suspended", "activate", "resume it first"),
    ],
)
async def test_illegal_transitions_are_refused_and_change_nothing(
    h: Harness, setup: str, command: str, message: str
) -> None:
    await h.create(NOTES, "notes")
    if setup == "terminated":
        await h.call("cancel", name="notes")
    elif setup == "suspended":
        await h.call("suspend", name="notes")
    before = await h.log("notes")
    refused = await h.refused(command, name="notes")
    assert refused.exit_code == 1
    assert message in str(refused)
    assert await h.log("notes") == before


async def test_migrate_switches_the_profile(tmp_path: Path) -> None:
    async with Harness(tmp_path, '[profiles.large]\nmodel = "large"\n') as h:
        await h.create(NOTES, "notes")
        await h.call("migrate", name="notes", profile="large")
        event = (await h.log("notes", types=["session.migrated"]))[0]
        assert event["data"]["to_profile"] == "large"
        assert (await h.call("show", name="notes"))["profile"] == "large"
        refused = await h.refused("migrate", name="notes", profile="nope")
        assert refused.exit_code == 5
        assert "no runner profile 'nope'" in str(refused)


async def test_log_filters_and_replay_views(h: Harness) -> None:
    await h.create(NOTES, "notes")
    for text in ("a", "b", "c"):
        await h.call("send", to="notes", text=text)
    assert [r["seq"] for r in await h.log("notes", since=3)] == [3, 4]
    assert len(await h.log("notes", types=["message.received"])) == 3
    assert (await h.log("notes", limit=1))[0]["seq"] == 4
    state = await h.call("replay", name="notes", upto=2)
    assert state["seq"] == 2
    assert state["messages_received"] == 1
    trace = await h.call("replay", name="notes", view="trace")
    assert len(trace) == 4
    assert "message.received" in trace[1]
    refused = await h.refused("log", name="notes", types=["tool.exploded"])
    assert refused.exit_code == 5


async def test_gate_reports_each_check(h: Harness) -> None:
    await h.create(NOTES, "notes")
    gate = await h.call("gate", name="notes")
    assert gate["ok"] is True
    assert any(c["name"] == "log intact" and c["ok"] for c in gate["checks"])


async def test_reload_updates_changed_specs_and_refuses_bad_ones(tmp_path: Path) -> None:
    async with Harness(tmp_path, 'specs = "specs"\n') as h:
        specs = tmp_path / "specs"
        specs.mkdir()
        (specs / "notes.toml").write_text(NOTES)
        assert (await h.call("reload"))["created"] == ["notes"]
        (specs / "notes.toml").write_text(NOTES.replace("collect notes", "collect better notes"))
        assert (await h.call("reload"))["updated"] == ["notes"]
        assert (await h.call("show", name="notes"))["goal"] == "collect better notes"
        (specs / "notes.toml").write_text('name = "notes"\npriority = 500\n')
        result = await h.call("reload")
        assert any("priority" in e for e in result["errors"])
        assert (await h.call("show", name="notes"))["goal"] == "collect better notes"
        (specs / "notes.toml").unlink()
        await h.call("reload")
        assert [r["name"] for r in await h.call("ps")] == ["notes"]  # none dropped
