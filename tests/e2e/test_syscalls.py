"""The syscalls through the real daemon and the real sessionctl: what the client
renders, a hand-over between two daemons, bundles through the socket. What each
syscall does to the table is tested in process (tests/inproc/test_syscalls.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.e2e.harness import Daemon, running, wait_event

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


def test_the_client_renders_what_the_syscalls_answer(daemon: Daemon) -> None:
    """What each syscall does to the table is tests/inproc/test_syscalls.py's; here,
    what sessionctl makes of the answers: tables, human text and exit codes."""
    create(daemon, "hello", HELLO)
    create(daemon, "notes", NOTES)
    table = daemon.ctl("ps", check=True).stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "STATE", "AGENT"]
    assert any(line.startswith("hello") and "sleeping" in line for line in table)
    shown = daemon.ctl("show", "hello", check=True).stdout
    assert "goal: say hello" in shown
    again = daemon.ctl("create", str(daemon.root / "hello.toml"))
    assert again.returncode == 1
    assert "exists already" in again.stderr
    unknown = daemon.write_spec("unk", 'name = "unk"\ncolour = "red"\n')
    done = daemon.ctl("create", str(unknown))
    assert done.returncode == 5
    assert "colour: unknown key" in done.stderr
    assert daemon.ctl("create", str(daemon.root / "missing.toml")).returncode == 5
    done = daemon.ctl("activate", "notes")
    assert done.returncode == 1
    assert "no [run] program" in done.stderr
    for text in ("a", "b", "c"):
        daemon.ctl("send", "notes", text, check=True)
    trace = daemon.ctl("replay", "notes", "--view", "trace", check=True).stdout.splitlines()
    assert len(trace) == 4
    assert "message.received" in trace[1]
    assert daemon.ctl("log", "notes", "--type", "tool.exploded").returncode == 5
    done = daemon.ctl("gate", "notes", check=True)
    assert "ok   log intact" in done.stdout
    assert done.stdout.strip().endswith("ok: the session may continue")
    daemon.ctl("activate", "hello", check=True)
    wait_event(daemon, "hello", "run.finished")
    digest = daemon.json("show", "hello")["last_run"]["stdout"]["ref"].removeprefix("sha256:")
    out = (daemon.state_dir / "sessions" / "hello" / "artifacts" / digest).read_bytes()
    assert out == b"hello from hello\n"
    wake = orjson.loads((daemon.root / "wake.json").read_bytes())
    assert wake["wakes"][0]["trigger"] == "manual"


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
