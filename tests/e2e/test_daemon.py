"""The daemon as a process: restarts, crashes, the state-dir lock, peers, the socket."""

from __future__ import annotations

import contextlib
import grp
import os
import queue
import shutil
import signal
import socket
import stat
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiond.ipc import fence
from tests.e2e.crafted import bundle_with_pending_approvals
from tests.e2e.harness import SESSIOND, Daemon, alive, running, short_dir, wait_event, wait_for
from tests.e2e.test_links import free_port

NOTES = 'name = "{name}"\ngoal = "notes"\n'
ARMED = 'name = "{name}"\n[[trigger]]\ntype = "message"\n'
SLOW = 'name = "{name}"\n[run]\nexec = ["sleep", "60"]\nresume = "never-rerun"\n'


def make(d: Daemon, name: str, template: str) -> None:
    d.ctl("create", str(d.write_spec(name, template.format(name=name))), check=True)


def populate(d: Daemon) -> None:
    """A session in every state: created, sleeping, suspended, terminated(cancelled),
    terminated(merged), blocked (pending approvals), and running."""
    make(d, "created", NOTES)
    make(d, "sleeping", ARMED)
    make(d, "suspended", NOTES)
    d.ctl("suspend", "suspended", check=True)
    make(d, "cancelled", NOTES)
    d.ctl("cancel", "cancelled", check=True)
    make(d, "parent", NOTES)
    for i in range(12):  # enough events for a snapshot at snapshot_every = 10
        d.ctl("send", "parent", f"hello {i}", check=True)
    d.ctl("fork", "parent", "--as", "child", check=True)
    d.ctl("merge", "child", "--summary", "done", check=True)
    d.ctl("import", str(bundle_with_pending_approvals(d.root)), check=True)
    make(d, "running", SLOW)
    d.ctl("activate", "running", check=True)


def table(d: Daemon) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = d.json("ps")
    return rows


def test_a_clean_restart_keeps_every_session_in_its_state() -> None:
    with running() as d:
        populate(d)
        d.ctl("suspend", "running", check=True)  # a clean stop leaves nothing running
        before = table(d)
        states = {r["name"]: r["state"] for r in before}
        assert states == {
            "created": "created", "sleeping": "sleeping", "suspended": "suspended",
            "cancelled": "terminated", "parent": "created", "child": "terminated",
            "asker": "blocked", "running": "suspended",
        }  # fmt: skip
        assert d.stop() == 0
        assert any(line.get("event") == "daemon.stopped" for line in d.lines)
        d.start()
        assert table(d) == before


@pytest.mark.parametrize("snapshots", ["kept", "deleted"])
def test_after_kill_9_the_table_is_rebuilt_and_a_cut_off_run_is_blocked(snapshots: str) -> None:
    with running("snapshot_every = 10\n") as d:
        populate(d)
        pid = d.json("show", "running")["pid"]
        before = {r["name"]: r for r in table(d)}
        d.kill9()
        # the daemon's spawner stops its runs when the daemon dies
        wait_for(lambda: not alive(pid), what="the cut-off program's end")
        if snapshots == "deleted":
            for folder in (d.state_dir / "sessions").glob("*/snapshots"):
                shutil.rmtree(folder)
                folder.mkdir(mode=0o700)
        else:
            assert list((d.state_dir / "sessions").glob("*/snapshots/state-*.json"))
        d.start()
        after = {r["name"]: r for r in table(d)}
        assert after.keys() == before.keys()
        for name, row in before.items():
            if name != "running":
                assert after[name] == row, name
        cut = wait_event(
            d, "running", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert "its resume rule is never-rerun" in cut["data"]["reason"]
        shown = d.json("show", "running")
        assert shown["state"] == "blocked"
        assert shown["last_run"]["status"] == "lost"
        lost = d.json("log", "running", "--type", "run.finished")[-1]["data"]["error"]
        assert lost == "daemon restarted during run"  # nothing was left to stop
        assert not alive(pid)  # never left running unsupervised, never duplicated


def test_a_restart_with_and_without_snapshots_gives_the_same_table() -> None:
    with running("snapshot_every = 10\n") as d:
        populate(d)
        d.ctl("cancel", "running", check=True)
        for i in range(30):
            d.ctl("send", "parent", f"note {i}", check=True)
        d.stop()
        d.start()
        with_snapshots = table(d)
        shows = {r["name"]: d.json("show", r["name"]) for r in with_snapshots}
        d.stop()
        for folder in (d.state_dir / "sessions").glob("*/snapshots"):
            for snap in folder.iterdir():
                snap.unlink()
        d.start()
        assert table(d) == with_snapshots
        assert {r["name"]: d.json("show", r["name"]) for r in with_snapshots} == shows


def test_sigterm_stops_running_programs_and_records_it() -> None:
    with running() as d:
        make(d, "slow", SLOW)
        d.ctl("activate", "slow", check=True)
        pid = d.json("show", "slow")["pid"]
        assert d.stop(signal.SIGTERM) == 0
        assert not alive(pid)
        d.start()
        # The stopped run did not end its turn: at the restart the turn continues once,
        # through the gate, which will not run a never-rerun command a second time.
        blocked = wait_event(
            d, "slow", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert (
            "the command [r1.command] was stopped before it finished" in (blocked["data"]["reason"])
        )
        assert "never-rerun" in blocked["data"]["reason"]
        shown = d.json("show", "slow")
        assert shown["last_run"]["status"] == "interrupted"
        assert shown["last_run"]["ends_turn"] is False
        reasons = [
            r["data"]["reason"] for r in d.json("log", "slow", "--type", "lifecycle.changed")
        ]
        assert "interrupted by daemon shutdown" in reasons


def test_one_daemon_per_state_dir() -> None:
    with running() as d:
        second = subprocess.run(
            [SESSIOND, "--state-dir", str(d.state_dir), "--socket", str(d.root / "other.sock")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert second.returncode == 1
        assert f"another sessiond (pid {d.proc.pid})" in second.stderr  # type: ignore[union-attr]
        assert d.json("ping")["pid"] == d.proc.pid  # type: ignore[union-attr]


def test_a_live_socket_is_never_stolen_a_stale_one_is_replaced() -> None:
    with running() as d:
        other_state = d.root / "state2"
        second = subprocess.run(
            [SESSIOND, "--state-dir", str(other_state), "--socket", str(d.socket)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert second.returncode == 1
        assert "another daemon is listening" in second.stderr
        assert d.json("ping")["sessions"] == 0
        d.kill9()
        assert d.socket.exists()  # left behind by the crash
        d.start()
        assert d.json("ping")["pid"] == d.proc.pid  # type: ignore[union-attr]


def test_a_bad_configuration_stops_start_up_naming_the_key() -> None:
    root = short_dir()
    try:
        d = Daemon(root, 'durability = "sometimes"\n')
        done = subprocess.run(
            [SESSIOND, "--config", str(d.config), "--state-dir", str(d.state_dir)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 2
        assert "durability" in done.stderr
        assert str(d.config) in done.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_unwritable_state_dir_is_refused_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    done = subprocess.run(
        [SESSIOND, "--state-dir", str(blocker / "state"), "--socket", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "cannot write to the state dir" in done.stderr


def test_state_dir_and_socket_are_owner_only() -> None:
    with running() as d:
        make(d, "notes", NOTES)
        assert os.stat(d.socket).st_mode & 0o777 == 0o600
        assert os.stat(d.state_dir).st_mode & 0o777 == 0o700
        assert os.stat(d.state_dir / "sessions" / "notes" / "events.jsonl").st_mode & 0o777 == 0o600
        # the table index: every session's row, appended as they change, then
        # rewritten whole at the stop
        index = d.state_dir / "table.index"
        wait_for(index.exists, what="the table index's first batch")
        assert os.stat(index).st_mode & 0o777 == 0o600
        d.stop()
        assert os.stat(index).st_mode & 0o777 == 0o600


def test_a_peer_with_another_uid_is_refused_by_the_credential_check() -> None:
    if os.geteuid() != 0:
        pytest.skip("dropping to another uid needs root; this test runs as a normal user")
    with running('[access]\ngroups = ["daemon"]\n') as d:
        gid = grp.getgrnam("daemon").gr_gid
        # owner-only mode bits; the group gets in through the ACL alone
        assert os.stat(d.socket).st_uid == os.geteuid()
        assert (fence.GROUP, fence.READ | fence.WRITE, gid) in acl_of(d.socket)
        assert (fence.OTHER, 0, 0xFFFFFFFF) in acl_of(d.socket)
        assert (fence.GROUP, fence.EXECUTE, gid) in acl_of(d.socket.parent)
        reply = _connect_as(d.socket, uid=65534, gid=65534, groups=[gid])
        assert reply["ok"] is False
        assert reply["error"]["code"] == "permission_denied"
        assert "uid 65534 may not use this daemon" in reply["error"]["message"]
        # logged before the reply, but read from the daemon's stderr by another thread
        wait_for(
            lambda: any(
                line.get("event") == "peer.refused" and line.get("uid") == 65534 for line in d.lines
            ),
            timeout=10,
            what="peer.refused in the daemon's log",
        )
        allowed = _connect_as(d.socket, uid=65534, gid=gid, groups=[gid])
        assert allowed["ok"] is True  # the same uid in the allowed group gets in


def acl_of(path: Path) -> list[tuple[int, int, int]]:
    return fence.decode_acl(os.getxattr(path, fence.XATTR, follow_symlinks=False))


def test_a_user_named_in_access_gets_in_through_the_acl_and_nobody_else_does() -> None:
    """[access] users used to get EACCES: the socket was opened to a group only."""
    if os.geteuid() != 0:
        pytest.skip("dropping to another uid needs root; this test runs as a normal user")
    with running('[access]\nusers = ["nobody"]\n') as d:
        assert stat.S_IMODE(os.stat(d.socket.parent).st_mode) & 0o007 == 0
        assert stat.S_IMODE(os.stat(d.socket).st_mode) & 0o007 == 0  # nothing for others
        assert (fence.USER, fence.READ | fence.WRITE, 65534) in acl_of(d.socket)
        assert (fence.USER, fence.EXECUTE, 65534) in acl_of(d.socket.parent)
        allowed = _connect_as(d.socket, uid=65534, gid=65534, groups=[])
        assert allowed["ok"] is True, allowed
        # another unprivileged uid is stopped by the file mode, before the credential check
        other = _connect_as(d.socket, uid=65533, gid=65533, groups=[], expect_refused=True)
        assert other["error"]["code"] == "child"
        assert "PermissionError" in other["error"]["message"]


@pytest.mark.parametrize("problem", ["writable by others", "owned by another uid"])
def test_a_socket_folder_others_could_write_is_refused_at_start(problem: str) -> None:
    root = short_dir()
    try:
        folder = root / "run"
        folder.mkdir()
        if problem == "writable by others":
            os.chmod(folder, 0o777)
        else:
            if os.geteuid() != 0:
                pytest.skip("giving a folder to another uid needs root")
            os.chown(folder, 65534, 65534)
        done = subprocess.run(
            [SESSIOND, "--state-dir", str(root / "state"), "--socket", str(folder / "s.sock")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        assert f"the socket folder {folder}" in done.stderr
        assert problem.split(maxsplit=1)[0] in done.stderr  # "writable" / "owned"
        assert not (folder / "s.sock").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _connect_as(
    path: Path, *, uid: int, gid: int, groups: list[int], expect_refused: bool = False
) -> dict[str, Any]:
    # the socket's own folder is the fence's business (its ACL); the ones above it
    # must let others through for the test to mean anything
    closed = [p for p in path.parents[1:] if not os.stat(p).st_mode & stat.S_IXOTH]
    if closed:
        pytest.skip(f"another uid cannot reach {path}: {closed[0]} is not searchable by others")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
        except OSError as exc:  # e.g. a user namespace that maps only uid 0 (some CI runners)
            os.write(
                write,
                orjson.dumps({"ok": False, "error": {"code": "no-drop", "message": repr(exc)}}),
            )
            os._exit(0)
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            # refused at connect, the write may fail: the answer waits in the socket
            with contextlib.suppress(BrokenPipeError):
                sock.sendall(b'{"id":1,"method":"ping","params":{}}\n')
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            os.write(write, data)
        except BaseException as exc:
            os.write(
                write, orjson.dumps({"ok": False, "error": {"code": "child", "message": repr(exc)}})
            )
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    os.waitpid(child, 0)
    reply: dict[str, Any] = orjson.loads(data)
    if not reply["ok"] and reply["error"]["code"] == "no-drop":
        pytest.skip(f"this machine cannot switch to uid {uid}: {reply['error']['message']}")
    if not expect_refused:
        assert reply["ok"] or reply["error"]["code"] != "child", reply["error"]["message"]
    return reply


def test_a_blocked_session_keeps_its_reason_through_restarts() -> None:
    with running() as d:
        d.ctl("import", str(bundle_with_pending_approvals(d.root)), check=True)
        d.stop()
        d.start()
        shown = d.json("show", "asker")
        assert shown["state"] == "blocked"
        assert len(shown["pending_approvals"]) == 2


def test_log_follow_streams_new_events_of_one_or_all_sessions() -> None:
    with running() as d:
        make(d, "notes", NOTES)
        follower = subprocess.Popen(
            [
                "sessionctl" if False else str(Path(SESSIOND).with_name("sessionctl")),
                "--json",
                "log",
                "--all",
                "--follow",
            ],
            env=d.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert follower.stdout is not None
            stream: queue.Queue[dict[str, Any]] = queue.Queue()
            out = follower.stdout

            def read() -> None:
                for raw in out:
                    stream.put(orjson.loads(raw))

            threading.Thread(target=read, daemon=True).start()
            # The follower is listening once a message sent now reaches it (it may
            # start after the first ones): only then is anything after it certain.
            for attempt in range(100):
                d.ctl("send", "notes", f"marker {attempt}", check=True)
                with contextlib.suppress(queue.Empty):
                    stream.get(timeout=0.2)
                    break
            make(d, "late", NOTES)
            d.ctl("send", "notes", "streamed", check=True)
            seen = []
            while True:
                record = stream.get(timeout=20)
                seen.append((record["session"], record["type"]))
                if record["type"] == "message.received" and record["data"]["text"] == "streamed":
                    break
            assert ("late", "session.created") in seen
            assert seen[-1] == ("notes", "message.received")
        finally:
            follower.kill()
            follower.wait()
            if follower.stdout is not None:
                follower.stdout.close()
        record = wait_event(
            d, "notes", "message.received", match=lambda r: r["data"]["text"] == "streamed"
        )
        assert record["data"]["sender"] == "sessionctl"


def test_the_shipped_configuration_and_example_sessions_work() -> None:
    """What `make run` starts: config/sessiond.toml with config/sessions/*.toml."""
    root = short_dir()
    try:
        d = Daemon(root)
        shipped = Path(__file__).parents[2] / "config"
        text = (shipped / "sessiond.toml").read_text()
        # as shipped but on a free port (its notices' links need a fixed one), with
        # its spec folder named from here
        assert 'listen = "127.0.0.1:8765"' in text
        text = text.replace('listen = "127.0.0.1:8765"', f'listen = "127.0.0.1:{free_port()}"')
        text = text.replace('specs = "sessions"', f'specs = "{shipped / "sessions"}"')
        d.config.write_text(text)
        d.start()
        console = d.json("web")["console"]  # the web console is on, as `make run` has it
        with urllib.request.urlopen(console + "/metrics", timeout=30) as metrics:
            assert b"sessiond_sessions" in metrics.read()
        rows = {r["name"]: r for r in d.json("ps")}
        assert rows["hello"]["state"] == "sleeping"
        assert rows["hello"]["next_wake"] == "on message"
        assert rows["notes"]["state"] == "created"
        d.ctl("activate", "hello", check=True)
        finished = wait_event(d, "hello", "run.finished")
        digest = finished["data"]["stdout"]["ref"].removeprefix("sha256:")
        out = (d.state_dir / "sessions" / "hello" / "artifacts" / digest).read_text()
        assert out.startswith("hello from hello run r1\nwoken by: ")
        assert '"trigger":"manual"' in out
        d.ctl("migrate", "notes", "--profile", "large", check=True)
        assert d.stop() == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
