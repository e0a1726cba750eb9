"""Every syscall through the real daemon and the real sessionctl, with its visible effect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.e2e.harness import Daemon, alive, running, wait_event

HELLO = """name = "hello"
goal = "say hello"
agent = "demo"
priority = 7
[run]
exec = ["sh", "-c", "echo hello from $SESSIOND_SESSION; echo \\"$SESSIOND_WAKE\\" > wake.json"]
cwd = "."
[[trigger]]
type = "message"
"""

NOTES = """name = "notes"
goal = "collect notes"
"""

SLOW = """name = "slow"
[run]
exec = ["sh", "-c", "trap 'exit 143' TERM; sleep 30 & wait"]
"""


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running('[profiles.large]\nmodel = "large"\n') as d:
        yield d


def create(d: Daemon, name: str, text: str) -> dict[str, object]:
    result: dict[str, object] = d.json("create", str(d.write_spec(name, text)))
    return result


def test_ping_says_version_and_pid(daemon: Daemon) -> None:
    info = daemon.json("ping")
    assert info["version"] == "0.1.0"
    assert info["pid"] == daemon.proc.pid  # type: ignore[union-attr]
    assert info["sessions"] == 0
    human = daemon.ctl("ping", check=True).stdout
    assert "sessiond 0.1.0" in human


def test_create_ps_show_and_the_armed_state(daemon: Daemon) -> None:
    hello = create(daemon, "hello", HELLO)
    notes = create(daemon, "notes", NOTES)
    assert hello["state"] == "sleeping"  # has a trigger: armed from creation
    assert notes["state"] == "created"  # no trigger: waits for activate
    rows = {r["name"]: r for r in daemon.json("ps")}
    assert rows["hello"]["next_wake"] == "on message"
    assert rows["hello"]["agent"] == "demo"
    assert rows["hello"]["priority"] == 7
    table = daemon.ctl("ps", check=True).stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "STATE", "AGENT"]
    assert any(line.startswith("hello") and "sleeping" in line for line in table)
    shown = daemon.ctl("show", "hello", check=True).stdout
    assert "goal: say hello" in shown
    again = daemon.ctl("create", str(daemon.root / "hello.toml"))
    assert again.returncode == 1
    assert "exists already" in again.stderr


def test_bad_specs_are_refused_naming_the_key(daemon: Daemon) -> None:
    bad = daemon.write_spec("bad", 'name = "bad"\n[run]\nexec = ["x"]\ntimeout = "soon"\n')
    done = daemon.ctl("create", str(bad))
    assert done.returncode == 5
    assert "run.timeout" in done.stderr
    assert "'soon'" in done.stderr
    unknown = daemon.write_spec("unk", 'name = "unk"\ncolour = "red"\n')
    done = daemon.ctl("create", str(unknown))
    assert done.returncode == 5
    assert "colour: unknown key" in done.stderr
    assert daemon.ctl("create", str(daemon.root / "missing.toml")).returncode == 5


def test_activate_runs_the_program_and_keeps_its_output(daemon: Daemon) -> None:
    create(daemon, "hello", HELLO)
    daemon.ctl("activate", "hello", check=True)
    wait_event(daemon, "hello", "run.finished")
    shown = daemon.json("show", "hello")
    assert shown["state"] == "sleeping"
    assert shown["runs"] == 1
    last = shown["last_run"]
    assert last["status"] == "ok"
    assert last["exit_code"] == 0
    digest = last["stdout"]["ref"].removeprefix("sha256:")
    out = (daemon.state_dir / "sessions" / "hello" / "artifacts" / digest).read_bytes()
    assert out == b"hello from hello\n"
    wake = orjson.loads((daemon.root / "wake.json").read_bytes())
    assert wake["wakes"][0]["trigger"] == "manual"
    types = [r["type"] for r in daemon.json("log", "hello")]
    assert types[2:] == [
        "wake.requested", "gate.evaluated", "lifecycle.changed",  # -> ready
        "tool.intent", "policy.decided", "tool.started", "lifecycle.changed",  # -> running
        "run.started", "tool.finished", "observation.projected", "run.finished",
        "lifecycle.changed",  # -> sleeping
    ]  # fmt: skip
    observation = daemon.json("log", "hello", "--type", "observation.projected")[0]["data"]
    assert observation["text"] == "exit 0; stdout: hello from hello"


def test_a_session_without_a_program_cannot_be_activated(daemon: Daemon) -> None:
    create(daemon, "notes", NOTES)
    done = daemon.ctl("activate", "notes")
    assert done.returncode == 1
    assert "no [run] program" in done.stderr


def test_send_reaches_the_mailbox_and_wakes_a_message_session(daemon: Daemon) -> None:
    create(daemon, "hello", HELLO)
    create(daemon, "notes", NOTES)
    sent = daemon.json("send", "notes", "remember the milk", "--from", "ann")
    assert sent["woke"] is False
    view = daemon.json("replay", "notes", "--view", "messages")
    assert {"role": "user", "kind": "message", "content": "remember the milk", "seq": sent["seq"],
            "sender": "ann"} in view  # fmt: skip
    sent = daemon.json("send", "hello", "wake up")
    assert sent["woke"] is True
    finished = wait_event(daemon, "hello", "run.finished")
    assert finished["data"]["status"] == "ok"
    wake = orjson.loads((daemon.root / "wake.json").read_bytes())
    assert wake["wakes"][0]["trigger"] == "message"
    assert wake["wakes"][0]["details"]["text"] == "wake up"


def test_compact_shows_the_summary_while_log_keeps_the_originals(daemon: Daemon) -> None:
    create(daemon, "notes", NOTES)
    for text in ("first note. more", "second note", "third note", "fourth note"):
        daemon.ctl("send", "notes", text, check=True)
    daemon.ctl("compact", "notes", "--keep", "1", check=True)
    view = [m["content"] for m in daemon.json("replay", "notes", "--view", "messages")]
    assert view[0] == "Goal: collect notes"
    assert view[1].startswith("Summary of earlier context (events 2-4): ")
    assert "first note." in view[1]
    assert view[2:] == ["fourth note"]
    texts = [r["data"]["text"] for r in daemon.json("log", "notes", "--type", "message.received")]
    assert texts == ["first note. more", "second note", "third note", "fourth note"]
    assert (
        daemon.json("log", "notes", "--type", "context.compacted")[0]["data"]["method"] == "builtin"
    )


def test_fork_then_merge_puts_the_childs_summary_in_the_parents_view(daemon: Daemon) -> None:
    create(daemon, "notes", NOTES)
    daemon.ctl("send", "notes", "one", check=True)
    daemon.ctl("send", "notes", "two", check=True)
    child = daemon.json("fork", "notes", "--as", "side", "--at", "2")
    assert child["parent"] == "notes"
    assert child["fork_seq"] == 2
    assert child["state"] == "created"
    parent_log = daemon.json("log", "notes")
    child_log = daemon.json("log", "side")
    assert child_log[:2] == parent_log[:2]  # same ids, same seqs
    assert child_log[2]["type"] == "session.forked"
    assert daemon.json("show", "notes")["children"] == ["side"]
    daemon.ctl("send", "side", "found it", check=True)
    merged = daemon.json("merge", "side", "--summary", "the answer is 42")
    assert merged["child"]["state"] == "terminated"
    assert merged["child"]["outcome"] == "merged"
    view = daemon.json("replay", "notes", "--view", "messages")
    assert view[-1]["content"] == "[merged from side] the answer is 42"


def test_fork_does_not_inherit_triggers_unless_asked(daemon: Daemon) -> None:
    create(daemon, "hello", HELLO)
    plain = daemon.json("fork", "hello", "--as", "plain")
    assert plain["state"] == "created"
    assert plain["triggers"] == []
    armed = daemon.json("fork", "hello", "--as", "armed", "--with-triggers")
    assert armed["state"] == "sleeping"
    assert armed["triggers"] == ["message"]


def test_suspend_resume_interrupt_cancel(daemon: Daemon) -> None:
    create(daemon, "notes", NOTES)
    assert daemon.json("suspend", "notes")["state"] == "suspended"
    assert daemon.json("resume", "notes")["state"] == "sleeping"
    create(daemon, "slow", SLOW)
    daemon.ctl("activate", "slow", check=True)
    pid = daemon.json("show", "slow")["pid"]
    assert pid
    assert daemon.json("interrupt", "slow")["state"] == "sleeping"
    assert not alive(pid)
    last = daemon.json("show", "slow")["last_run"]
    assert last["status"] == "interrupted"
    daemon.ctl("activate", "slow", check=True)
    pid = daemon.json("show", "slow")["pid"]
    cancelled = daemon.json("cancel", "slow")
    assert (cancelled["state"], cancelled["outcome"]) == ("terminated", "cancelled")
    assert not alive(pid)


@pytest.mark.parametrize(
    ("setup", "command", "message"),
    [
        ("terminated", ["activate"], "it is terminated"),
        ("terminated", ["suspend"], "it is terminated"),
        ("terminated", ["cancel"], "it is terminated"),
        ("created", ["resume"], "not suspended"),
        ("created", ["interrupt"], "only a running session"),
        ("suspended", ["suspend"], "from suspended a session can only become"),
        ("suspended", ["activate"], "resume it first"),
    ],
)
def test_illegal_transitions_are_refused_and_change_nothing(
    daemon: Daemon, setup: str, command: list[str], message: str
) -> None:
    create(daemon, "notes", NOTES)
    if setup == "terminated":
        daemon.ctl("cancel", "notes", check=True)
    elif setup == "suspended":
        daemon.ctl("suspend", "notes", check=True)
    before = daemon.json("log", "notes")
    done = daemon.ctl(*command, "notes")
    assert done.returncode == 1
    assert message in done.stderr
    assert daemon.json("log", "notes") == before


def test_migrate_switches_the_profile(daemon: Daemon) -> None:
    create(daemon, "notes", NOTES)
    daemon.ctl("migrate", "notes", "--profile", "large", check=True)
    event = daemon.json("log", "notes", "--type", "session.migrated")[0]
    assert event["data"]["to_profile"] == "large"
    assert daemon.json("show", "notes")["profile"] == "large"
    done = daemon.ctl("migrate", "notes", "--profile", "nope")
    assert done.returncode == 5
    assert "no runner profile 'nope'" in done.stderr


def test_migrate_to_another_daemon_hands_the_session_over(daemon: Daemon) -> None:
    create(daemon, "hello", HELLO)
    daemon.ctl("send", "hello", "before the move", check=True)
    wait_event(
        daemon,
        "hello",
        "lifecycle.changed",
        match=lambda r: r["data"]["to"] == "sleeping" and r["seq"] > 3,
    )
    with running() as other:
        moved = daemon.json("migrate", "hello", "--to", str(other.socket))
        assert (moved["state"], moved["outcome"]) == ("terminated", "migrated")
        there = other.json("show", "hello")
        assert there["state"] == "sleeping"  # not running: armed, gate first
        assert there["imported_from"] == "hello"
        other.ctl("activate", "hello", check=True)
        finished = wait_event(other, "hello", "run.finished")
        assert finished["data"]["status"] == "ok"
        messages = other.json("replay", "hello", "--view", "messages")
        assert any(m["content"] == "before the move" for m in messages)


def test_export_and_import_round_trip(daemon: Daemon) -> None:
    create(daemon, "notes", NOTES)
    daemon.ctl("send", "notes", "keep me", check=True)
    bundle = daemon.root / "notes.bundle"
    exported = daemon.json("export", "notes", "-o", str(bundle))
    assert exported["events"] == 2
    imported = daemon.json("import", str(bundle), "--as", "copy")
    assert imported["imported_from"] == "notes"
    assert daemon.json("log", "copy")[:2] == daemon.json("log", "notes")
    bundle.write_bytes(b"not a bundle")
    done = daemon.ctl("import", str(bundle), "--as", "copy2")
    assert done.returncode == 5
    assert "not a sessiond bundle" in done.stderr


def test_log_filters_and_replay_views(daemon: Daemon) -> None:
    create(daemon, "notes", NOTES)
    for text in ("a", "b", "c"):
        daemon.ctl("send", "notes", text, check=True)
    assert [r["seq"] for r in daemon.json("log", "notes", "--since", "3")] == [3, 4]
    assert len(daemon.json("log", "notes", "--type", "message.received")) == 3
    assert daemon.json("log", "notes", "--limit", "1")[0]["seq"] == 4
    state = daemon.json("replay", "notes", "--upto", "2")
    assert state["seq"] == 2
    assert state["messages_received"] == 1
    trace = daemon.ctl("replay", "notes", "--view", "trace", check=True).stdout.splitlines()
    assert len(trace) == 4
    assert "message.received" in trace[1]
    done = daemon.ctl("log", "notes", "--type", "tool.exploded")
    assert done.returncode == 5


def test_gate_reports_each_check(daemon: Daemon) -> None:
    create(daemon, "notes", NOTES)
    done = daemon.ctl("gate", "notes", check=True)
    assert "ok   log intact" in done.stdout
    assert done.stdout.strip().endswith("ok: the session may continue")


def test_approve_and_deny_answer_pending_approvals(daemon: Daemon, tmp_path: Path) -> None:
    from tests.e2e.crafted import bundle_with_pending_approvals

    bundle = bundle_with_pending_approvals(tmp_path)
    daemon.ctl("import", str(bundle), check=True)
    shown = daemon.json("show", "asker")
    assert [a["call"] for a in shown["pending_approvals"]] == ["c1", "c2"]
    done = daemon.ctl("approve", "asker")
    assert done.returncode == 5
    assert "say which with --call" in done.stderr
    daemon.ctl("approve", "asker", "--call", "c1", "--by", "ann", check=True)
    daemon.ctl("deny", "asker", "--call", "c2", "--reason", "too risky", check=True)
    granted = daemon.json("log", "asker", "--type", "approval.granted")[0]["data"]
    assert granted["by"] == "ann"
    assert granted["expires_at"]
    denied = daemon.json("log", "asker", "--type", "approval.denied")[0]["data"]
    assert denied["reason"] == "too risky"
    assert daemon.json("show", "asker")["pending_approvals"] == []
    assert daemon.ctl("approve", "asker").returncode == 1


def test_reload_updates_changed_specs_and_refuses_bad_ones(tmp_path: Path) -> None:
    with running('specs = "specs"\n') as d:
        specs = d.root / "specs"
        specs.mkdir()
        (specs / "notes.toml").write_text(NOTES)
        assert d.json("reload")["created"] == ["notes"]
        (specs / "notes.toml").write_text(NOTES.replace("collect notes", "collect better notes"))
        assert d.json("reload")["updated"] == ["notes"]
        assert d.json("show", "notes")["goal"] == "collect better notes"
        (specs / "notes.toml").write_text('name = "notes"\npriority = 500\n')
        done = d.ctl("reload")
        assert done.returncode == 1
        assert "priority" in done.stdout
        assert d.json("show", "notes")["goal"] == "collect better notes"  # the old one stays
        (specs / "notes.toml").unlink()
        d.ctl("reload")
        assert [r["name"] for r in d.json("ps")] == ["notes"]  # none dropped


def test_the_daemon_not_running_is_exit_3_with_what_to_do(tmp_path: Path) -> None:
    import subprocess

    from tests.e2e.harness import SESSIONCTL

    done = subprocess.run(
        [SESSIONCTL, "--socket", str(tmp_path / "none.sock"), "ps"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 3
    assert "not reachable" in done.stderr
    assert "start it with 'sessiond'" in done.stderr


def test_usage_errors_are_exit_2() -> None:
    import subprocess

    from tests.e2e.harness import SESSIONCTL

    done = subprocess.run(
        [SESSIONCTL, "fork", "x"], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2


def test_ps_watch_refreshes_the_table(daemon: Daemon) -> None:
    import subprocess

    from tests.e2e.harness import SESSIONCTL

    create(daemon, "notes", NOTES)
    proc = subprocess.Popen(
        [SESSIONCTL, "ps", "--watch", "0.1"], env=daemon.env, stdout=subprocess.PIPE, text=True
    )
    # Read until the table has been drawn twice (however long a loaded machine takes),
    # not for a fixed second that may hold only one refresh.
    seen: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            seen.append(line)
            if sum("sessiond: 1 sessions" in s for s in seen) >= 2:
                break
    finally:
        proc.kill()
        proc.communicate()
    out = "".join(seen)
    assert out.count("sessiond: 1 sessions") >= 2
    assert "notes" in out
