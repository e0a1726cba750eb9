"""Recovery is done before every session is open (docs/design.md, "Start-up").

After a start from the table index, ``daemon.ready`` (READY=1) comes once every
session's state is proven (recovered from its log, or vouched for by its index
entry) and every wake is armed: the sessions whose spec has triggers are opened
first, the others after, in the background. The test-only hold
``fault_hold = "open-late"`` stops that background load right after
``daemon.ready``, until a file exists: everything here is asked while sessions
are still not opened after the start-up is done, and must be answered exactly as
if they were. Nothing waits on time: on the daemon's own log lines, and on the
logs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.harness import SESSIONCTL, Daemon, held_daemon, wait_event
from tests.e2e.receivers import receiving

PLAIN = 'name = "{name}"\n[run]\nexec = ["true"]\ncwd = "."\n'
WATCH = PLAIN + '[[trigger]]\ntype = "watch"\npaths = ["data/*.csv"]\n'
BOUND = PLAIN + '[bind]\nfiles = ["rates.csv"]\n'


@pytest.fixture
def late() -> Iterator[Daemon]:
    with held_daemon("open-late") as d:
        yield d.start()


def create(d: Daemon, name: str, text: str = PLAIN) -> None:
    d.ctl("create", str(d.write_spec(name, text.format(name=name))), check=True)


def restart_late(d: Daemon) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start again with the load after the start-up held; return its ``index.read``
    and ``daemon.ready`` lines."""
    (d.root / "go").unlink(missing_ok=True)
    since = len(d.lines)
    d.start(wait=False)
    ready = d.wait_line("daemon.ready", since=since)
    return d.wait_line("index.read", since=since), ready


def still_pending(d: Daemon, since: int) -> bool:
    """The background load has not ended (its index rewrite or its collection)."""
    return not any(line.get("event") == "daemon.loaded" for line in d.lines[since:])


def release(d: Daemon) -> None:
    since = len(d.lines)
    (d.root / "go").touch()
    d.wait_line("daemon.loaded", since=since)


def test_ready_comes_with_sessions_unopened_and_serves_them_exactly(late: Daemon) -> None:
    # Behaviour change: before, daemon.ready waited for every session to be opened.
    d = late
    for name in ("a", "b"):
        create(d, name)
    create(d, "w", WATCH)
    d.ctl("suspend", "b", check=True)
    rows = d.json("ps", "--all")
    d.stop()
    since = len(d.lines)
    read, ready = restart_late(d)
    assert (read["listed"], read["opened_first"], read["to_arm"]) == (3, 0, 1)
    assert ready["unopened"] == 2  # a and b: proven by their entries, opened later
    assert ready["sessions"] == 3
    assert ready["suspended"] == 1
    assert d.json("ps", "--all") == rows  # listed exactly, from their entries
    # a create of a name not opened yet is refused as for an open session
    refused = d.ctl("create", str(d.write_spec("a", PLAIN.format(name="a"))))
    assert refused.returncode != 0
    assert "exists already" in refused.stderr
    # a send to one is delivered (it is opened for it)
    d.ctl("send", "a", "after ready", check=True)
    sent = d.json("log", "a", "--type", "message.received")
    assert [r["data"]["text"] for r in sent] == ["after ready"]
    assert still_pending(d, since)  # b was never opened: all of it after ready
    release(d)
    after = {r["name"]: r for r in d.json("ps", "--all")}
    assert after["b"] == {r["name"]: r for r in rows}["b"]


def test_a_watch_and_a_dependency_are_armed_at_ready(late: Daemon) -> None:
    # Their sessions are opened before ready (their specs have triggers); the others
    # are not, and the watcher fires meanwhile.
    d = late
    (d.root / "data").mkdir()
    (d.root / "rates.csv").write_text("rate,1\n")
    create(d, "w", WATCH)
    create(d, "payroll", BOUND)
    create(d, "idle")
    d.stop()
    since = len(d.lines)
    read, ready = restart_late(d)
    assert (read["to_arm"], ready["unopened"]) == (2, 1)
    (d.root / "data" / "a.csv").write_text("1,2\n")
    (d.root / "rates.csv").write_text("rate,2\n")
    woke = wait_event(d, "w", "run.finished")
    assert woke["data"]["status"] == "ok"
    bound = wait_event(d, "payroll", "run.finished")
    assert bound["data"]["status"] == "ok"
    assert still_pending(d, since)  # idle is still not open
    release(d)


def test_a_kill_9_right_after_ready_loses_nothing(late: Daemon) -> None:
    d = late
    for name in ("a", "b", "c"):
        create(d, name)
    d.stop()
    restart_late(d)
    d.ctl("send", "b", "before the crash", check=True)
    create(d, "fresh")
    rows = d.json("ps", "--all")
    d.kill9()  # b and fresh opened, a and c never were
    (d.root / "go").touch()
    since = len(d.lines)
    d.start()
    read = d.wait_line("index.read", since=since)
    assert read["listed"] + read["opened_first"] == 4
    assert d.json("ps", "--all") == rows
    sent = d.json("log", "b", "--type", "message.received")
    assert [r["data"]["text"] for r in sent] == ["before the crash"]
    # and the logs alone say the same: a start without the index
    d.stop()
    (d.state_dir / "table.index").unlink()
    d.start()
    assert d.json("ps", "--all") == rows


def test_gc_after_ready_reads_every_session(late: Daemon) -> None:
    # A gc reads each session: one asked while sessions are not opened waits for
    # them (each has two snapshots, one past the rule's one to keep).
    d = late
    names = ("a", "b", "c")
    for name in names:
        create(d, name)
    d.stop()  # a snapshot of each
    d.config.write_text(d.config.read_text() + "[retention]\nsnapshots = 1\n")
    d.start()
    for name in names:
        d.ctl("send", name, "moved", check=True)
    d.stop()  # a second one
    since = len(d.lines)
    restart_late(d)
    gc = subprocess.Popen(
        [SESSIONCTL, "--json", "gc", "--dry-run"],
        env=d.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    rows = socket.socket(socket.AF_UNIX)  # the console's rows: every session's
    try:
        rows.connect(str(d.socket))
        rows.sendall(b'{"id": 1, "method": "web.rows", "params": {}}\n')
        assert still_pending(d, since)
        release(d)
        out, err = gc.communicate(timeout=120)
        answer = orjson.loads(rows.makefile("rb").readline())
    finally:
        rows.close()
        if gc.poll() is None:
            gc.kill()
            gc.wait()
    assert gc.returncode == 0, err
    report = orjson.loads(out)
    assert report["snapshots"] == len(names)
    assert sorted(s["name"] for s in report["sessions"]) == list(names)
    assert [r["name"] for r in answer["result"]] == list(names)
    assert [r["state"] for r in answer["result"]] == ["created"] * len(names)


def test_a_notice_not_delivered_before_the_stop_goes_at_ready() -> None:
    # A session the index vouches for whose event a notify target has not taken:
    # its log is read back before ready (the session is opened for it), not after.
    with (
        receiving(status=503) as receiver,
        held_daemon(
            "open-late",
            f'[[notify]]\nname = "hook"\nurl = "json://{receiver.url}/hook"\n'
            'events = ["lifecycle.changed"]\nretry_min = "50ms"\nretry_max = "200ms"\n',
        ) as d,
    ):
        d.start()
        create(d, "a")
        create(d, "idle")
        d.ctl("suspend", "a", check=True)
        [changed] = d.json("log", "a", "--type", "lifecycle.changed")
        receiver.wait(lambda reqs: len(reqs) >= 1)  # tried, refused
        d.stop()  # undelivered: it goes at the next start
        with receiver.changed:
            receiver.status = 200
        since = len(d.lines)
        read, ready = restart_late(d)
        assert read["listed"] == 2
        assert ready["unopened"] == 1  # idle; a was opened for its notice
        [notice] = receiver.wait(with_id(f"a:{changed['seq']}"))
        assert notice["event"] == "lifecycle.changed"
        assert still_pending(d, since)
        release(d)


def with_id(notice_id: str) -> Any:
    return lambda reqs: [
        n for r in reqs if r.status < 300 and (n := orjson.loads(r.body))["notice_id"] == notice_id
    ]


def test_an_index_without_the_new_fields_opens_its_sessions_before_ready(late: Daemon) -> None:
    # An index an older daemon wrote says nothing of triggers or workspaces: its
    # sessions may have triggers, so each is opened before ready, and the index is
    # written again with the fields (the next start needs open none of them).
    d = late
    create(d, "a")
    create(d, "b")
    d.stop()
    path = d.state_dir / "table.index"
    header, *lines = path.read_bytes().splitlines()
    old = [orjson.loads(line) for line in lines]
    for entry in old:
        del entry["triggers"], entry["workspace"]
    path.write_bytes(b"\n".join([header, *map(orjson.dumps, old)]) + b"\n")
    read, ready = restart_late(d)
    assert (read["listed"], read["to_arm"], ready["unopened"]) == (2, 2, 0)
    rewritten = [orjson.loads(line) for line in path.read_bytes().splitlines()[1:]]
    assert {e["name"]: e["triggers"] for e in rewritten} == {"a": False, "b": False}
    d.stop()
    read, ready = restart_late(d)
    assert (read["listed"], read["to_arm"], ready["unopened"]) == (2, 0, 2)


def test_a_spec_file_changed_while_stopped_is_applied_before_ready() -> None:
    with held_daemon("open-late", 'specs = "specs"\n') as d:
        root = d.root
        (root / "specs").mkdir()
        spec = root / "specs" / "a.toml"
        spec.write_text(PLAIN.format(name="a"))
        d.start()  # the spec folder's a is created
        create(d, "idle")
        d.stop()
        spec.write_text(PLAIN.format(name="a") + '[labels]\nteam = "x"\n')
        since = len(d.lines)
        _, ready = restart_late(d)
        assert ready["unopened"] == 1  # idle; a was opened to compare its spec
        rows = {r["name"]: r for r in d.json("ps", "--all")}
        assert rows["a"]["labels"] == {"team": "x"}
        assert still_pending(d, since)
        release(d)


def test_a_spec_folders_unchanged_sessions_are_left_unopened() -> None:
    # Behaviour change: before, every session a spec file names was opened before
    # ready to compare its spec; its stored spec is compared now, unopened.
    with held_daemon("open-late", 'specs = "specs"\n') as d:
        root = d.root
        (root / "specs").mkdir()
        for name in ("a", "b"):
            (root / "specs" / f"{name}.toml").write_text(PLAIN.format(name=name))
        d.start()  # the spec folder's a and b are created
        rows = d.json("ps", "--all")
        d.stop()
        since = len(d.lines)
        _, ready = restart_late(d)
        assert ready["unopened"] == 2
        assert _opened_files(d, "a") == _opened_files(d, "b") == []
        assert d.json("ps", "--all") == rows
        # a reload with one changed: that one is opened and changed, the other not
        (root / "specs" / "a.toml").write_text(PLAIN.format(name="a") + '[labels]\nteam = "x"\n')
        reloaded = d.json("reload")
        assert reloaded["updated"] == ["a"], reloaded
        assert reloaded["unchanged"] == 1, reloaded
        assert {r["name"]: r for r in d.json("ps", "--all")}["a"]["labels"] == {"team": "x"}
        assert _opened_files(d, "b") == []
        assert still_pending(d, since)
        release(d)


def test_a_run_after_ready_cannot_see_an_unopened_sessions_workspace(late: Daemon) -> None:
    # A run's sandbox hides every other session's workspace: one not opened yet as
    # its index entry records it (without opening it). Outside /tmp: a run has a
    # private one.
    d = late
    base = Path(tempfile.mkdtemp(prefix="sd-", dir="/var/tmp"))
    try:
        other, reader = base / "other", base / "reader"
        other.mkdir()
        reader.mkdir()
        secret = other / "secret.txt"
        secret.write_text("the other session's secret")
        for path in (base, other, secret, reader):  # readable by all: only the
            os.chmod(path, 0o755)  # boundary stands between it and the run
        create(d, "other", f'name = "other"\n[run]\nexec = ["true"]\ncwd = "{other}"\n')
        program = ["sh", "-c", f"cat {secret} > seen.txt 2>&1; echo done >> seen.txt"]
        create(
            d,
            "reader",
            f'name = "reader"\n[run]\nexec = {orjson.dumps(program).decode()}\n'
            f'cwd = "{reader}"\nretries = 0\n',
        )
        d.stop()
        since = len(d.lines)
        _, ready = restart_late(d)
        assert ready["unopened"] == 2
        d.ctl("activate", "reader", check=True)
        wait_event(d, "reader", "run.finished")
        seen = (reader / "seen.txt").read_text()
        assert seen.endswith("done\n")  # it ran
        assert "the other session's secret" not in seen
        assert still_pending(d, since)  # other was never opened
        release(d)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _opened_files(d: Daemon, name: str) -> list[str]:
    """The daemon's open files in session ``name``'s folder (an opened session
    holds its log open; one not opened yet holds nothing there)."""
    assert d.proc is not None
    folder = f"{d.state_dir}/sessions/{name}/"
    fds = Path(f"/proc/{d.proc.pid}/fd")
    held = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith(folder):
            held.append(target)
    return held


def test_a_web_request_not_logged_in_opens_no_session() -> None:
    # Attack: before any login, a request naming a session not opened yet made the
    # daemon open it (and resume it: arm its triggers, take its due wakes) for a
    # caller it then refused with 401. Nothing is done for a request refused.
    from tests.e2e.webclient import WEB, Client, logged_in, login

    with held_daemon("open-late", WEB) as d:
        d.start()
        create(d, "idle")
        d.stop()
        since = len(d.lines)
        _, ready = restart_late(d)
        assert ready["unopened"] == 1
        base, _ = login(d)
        assert _opened_files(d, "idle") == []
        for path in ("/api/s/idle/events", "/api/s/idle/messages"):
            assert Client(base).get(path).status == 401
        assert _opened_files(d, "idle") == []  # not opened for the refused requests
        # a logged-in request for it opens it and is answered from its log
        answer = logged_in(d).get("/api/s/idle/events")
        assert answer.status == 200, answer
        assert b"session.created" in answer.body
        assert _opened_files(d, "idle") != []
        assert still_pending(d, since)  # the background load did not open it
        release(d)


def test_a_refused_peer_opens_no_session() -> None:
    # Attack: a session's run that reaches the control socket (no sandbox) may only
    # ping; a request of its naming a session not opened yet still made the daemon
    # open it (and resume it) before the refusal.
    with held_daemon("open-late", '[run]\nsandbox = "off"\n') as d:
        root = d.root
        d.start()
        create(d, "idle")
        asking = (
            "import socket, sys\n"
            "c = socket.socket(socket.AF_UNIX)\n"
            f"c.connect({str(d.socket)!r})\n"
            'c.sendall(b\'{"id": 1, "method": "show", "params": {"name": "idle"}}\\n\')\n'
            "open('answer.json', 'wb').write(c.makefile('rb').readline())\n"
        )
        since, _ = asker_after_a_restart(d, asking, root)
        answer = orjson.loads((root / "answer.json").read_bytes())
        assert answer["ok"] is False  # refused: a run may only ping
        assert _opened_files(d, "idle") == []  # and nothing was done for it
        assert still_pending(d, since)
        release(d)


def asker_after_a_restart(d: Daemon, asking: str, cwd: Path) -> tuple[int, dict[str, Any]]:
    """``asker`` (python3 -c ``asking`` in ``cwd``) made, the daemon restarted with it
    and ``idle`` unopened, then activated: the daemon's line count before the
    restart, and the run's end."""
    program = ["python3", "-c", asking]
    text = (
        f'name = "asker"\n[run]\nexec = {orjson.dumps(program).decode()}\n'
        f'cwd = "{cwd}"\nretries = 0\n'
    )
    d.ctl("create", str(d.write_spec("asker", text)), check=True)
    d.stop()
    since = len(d.lines)
    _, ready = restart_late(d)
    assert ready["unopened"] == 2
    d.ctl("activate", "asker", check=True)
    return since, wait_event(d, "asker", "run.finished")


def test_a_program_request_with_a_wrong_token_opens_no_session(late: Daemon) -> None:
    # Attack: a sandboxed run sends its program endpoint requests naming another
    # session not opened yet, with a token that is no run's: refused, and the daemon
    # opened that session first for it.
    d = late
    create(d, "idle")
    asking = (
        "import os, socket\n"
        "out = open('answers.jsonl', 'wb')\n"
        "for line in (\n"
        '    b\'{"id": 1, "method": "show", "token": "x", "params": {"name": "idle"}}\',\n'
        '    b\'{"id": 2, "method": "sdk.send", "params": {"token": "x", "to": "idle",\'\n'
        '    b\' "text": "hi", "ordinal": 1}}\',\n'
        "):\n"
        "    c = socket.socket(socket.AF_UNIX)\n"
        "    c.connect(os.environ['SESSIOND_SOCKET'])\n"
        "    c.sendall(line + b'\\n')\n"
        "    out.write(c.makefile('rb').readline())\n"
        "    c.close()\n"
        "out.close()\n"
    )
    workspace = Path(tempfile.mkdtemp(prefix="sd-", dir="/var/tmp"))  # (a run's /tmp is its own)
    try:
        os.chmod(workspace, 0o755)
        since, finished = asker_after_a_restart(d, asking, workspace)
        assert finished["data"]["status"] == "ok", finished
        lines = (workspace / "answers.jsonl").read_bytes().splitlines()
        answers = [orjson.loads(line) for line in lines]
        assert [a["ok"] for a in answers] == [False, False], answers  # no run's token
        assert _opened_files(d, "idle") == []  # and nothing was done for them
        assert still_pending(d, since)
        release(d)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
