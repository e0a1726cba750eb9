"""The boundary through the real daemon and real bubblewrap (sessiond/runs/sandbox.py).

A hostile program (programs/escape.py) tries to reach what would let it break
the daemon's promises: the state dir, the console's link key and logins, the
notices, the daemon's configuration, another session's workspace, the control
socket; to write outside its workspace; to raise its privileges through a
setuid program; to kill its spawner, its holder and the daemon. Each attempt
goes to a ledger in its workspace, and each must have been refused. Then: the
sandbox off is said by ``ps``, ``show`` and ``/metrics``; a missing bubblewrap
keeps runs from starting, naming it; ``network = "none"`` leaves ``lo`` alone;
a root daemon's run has a uid of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sessiond.sandboxconfig import parse_uid_range
from tests.e2e.harness import Daemon, running, wait_event, wait_for
from tests.e2e.test_links import free_port
from tests.e2e.webclient import logged_in

PROGRAMS = Path(__file__).parent / "programs"
ROOT = os.geteuid() == 0
DYNAMIC = parse_uid_range("458752-524287")
MARKER = "postgresql://sessiond:hunter2@db/sessiond"

needs_root = pytest.mark.skipif(not ROOT, reason="dynamic uids need a root daemon")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(p) for p in f.read().split()]
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def spec(name: str, workspace: Path, program: list[str], extra: str = "") -> str:
    return (
        f'name = "{name}"\n[run]\nexec = {json.dumps(program)}\ncwd = "{workspace}"\n'
        f"retries = 0\n{extra}"
    )


def stderr_of(d: Daemon, name: str, finished: dict[str, Any]) -> str:
    """The run's stderr, for the failure message."""
    ref = finished["data"].get("stderr")
    if not ref:
        return ""
    blob = d.state_dir / "sessions" / name / "artifacts" / ref["ref"].split(":")[1]
    return blob.read_text(errors="replace") if blob.exists() else ""


def start(d: Daemon, name: str, text: str) -> None:
    d.ctl("create", str(d.write_spec(name, text)), check=True)
    d.ctl("activate", name, check=True)


def test_a_hostile_program_is_refused_everything_outside_its_sandbox() -> None:
    port = free_port()
    config = (
        f'# the cluster\'s dsn would be here: {MARKER}\n[web]\nlisten = "127.0.0.1:{port}"\n'
        '[[notify]]\nname = "file"\nurl = "jsonl://notices.jsonl"\nlinks = true\n'
        'events = ["approval.requested"]\n'
    )
    others = Path(tempfile.mkdtemp(prefix="sd-", dir="/var/tmp"))
    try:
        attack(config, others)
    finally:
        shutil.rmtree(others)


def attack(config: str, others: Path) -> None:
    with running(config) as d:
        # another session: a secret in its workspace, an approval pending (a notice
        # with signed links: the link key), and a console login minted
        # (outside /tmp, of which a run has a private one: hidden by the boundary itself)
        other = others / "other"
        other.mkdir()
        (other / "secret.txt").write_text("the other session's secret")
        for path in (others, other, other / "secret.txt"):  # readable by all: only the
            os.chmod(path, 0o755)  # boundary stands between it and the run
        start(d, "other", spec("other", other, ["true"], '[policy]\nask = ["command"]\n'))
        wait_event(d, "other", "approval.requested")
        notices = d.state_dir / "notices.jsonl"
        wait_for(lambda: notices.exists() and notices.read_text(), what="the notice")
        assert (d.state_dir / "web" / "links.key").exists()
        d.json("web")
        assert (d.state_dir / "web" / "logins.json").exists()
        # a setuid-root program the run can reach
        tools = d.root / "tools"
        tools.mkdir()
        shutil.copy("/usr/bin/id", tools / "suid-id")
        os.chmod(tools / "suid-id", 0o4755)
        os.chmod(tools, 0o755)
        spawner = children(d.proc.pid)  # type: ignore[union-attr]
        assert spawner
        pids = [d.proc.pid, *spawner]  # type: ignore[union-attr]
        ws = d.root / "escape"
        ws.mkdir()
        env = {
            "ESCAPE_STATE": str(d.state_dir),
            "ESCAPE_CONTROL": str(d.socket),
            "ESCAPE_NOTICES": str(notices),
            "ESCAPE_CONFIG": str(d.config),
            "ESCAPE_OTHER": str(other / "secret.txt"),
            "ESCAPE_SUID": str(tools / "suid-id"),
            "ESCAPE_PIDS": ",".join(map(str, pids)),
        }
        extra = f"readable = [{json.dumps(str(tools))}]\n[run.env]\n" + "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in env.items()
        )
        start(d, "escape", spec("escape", ws, [sys.executable, str(PROGRAMS / "escape.py")], extra))
        wait_event(d, "escape", "run.started")
        holder = d.json("show", "escape")["pid"]
        (ws / "holder.pid").write_text(str(holder))
        finished = wait_event(d, "escape", "run.finished")
        assert finished["data"]["status"] == "ok", stderr_of(d, "escape", finished)
        ledger = json.loads((ws / "ledger.json").read_text())
        attempts = ledger["attempts"]
        assert set(attempts) == {
            "state dir", "uids", "links.key", "logins", "notices", "config", "other workspace",
            "control socket", "write outside", "setuid copy", "su",
            "kill spawner and daemon", "kill holder",
        }  # fmt: skip
        let_through = {k: v for k, v in attempts.items() if not v["refused"]}
        assert not let_through, let_through
        assert "No such file" in attempts["other workspace"]["detail"]  # hidden, not denied
        # nothing it wrote reached the outside, and everything it aimed at lives on
        assert not Path("/etc/escaped").exists()
        assert not (d.state_dir / "escaped").exists()
        assert not (PROGRAMS / "escaped").exists()
        assert all(alive(p) for p in pids)
        assert d.json("ping")["pid"] == d.proc.pid  # type: ignore[union-attr]
        facts = ledger["facts"]
        assert facts["no_new_privs"] == ["NoNewPrivs:\t1"]
        assert not set(facts["pids"]) & {*pids, holder}  # it sees its own processes only
        assert '"ok"' in facts["endpoint"] or "error" in facts["endpoint"]  # its endpoint answers
        home = Path(facts["home"])
        assert home.is_relative_to(d.state_dir)
        assert (home / "note").read_text() == "a home of its own"
        if ROOT:
            assert facts["uid"] in DYNAMIC
            assert facts["uid"] not in (0, os.getuid())
            assert os.stat(home / "note").st_uid == facts["uid"]
        # the ledger in its workspace is the run's (the workspace is its to write)
        assert os.stat(ws / "ledger.json").st_uid == facts["uid"]


@needs_root
def test_a_run_of_a_root_daemon_has_a_dynamic_uid_kept_across_runs_and_restarts() -> None:
    with running() as d:
        ws = d.root / "ws"
        ws.mkdir()
        (ws / "given.txt").write_text("written by the operator")
        subprocess.run(["git", "init", "-q", str(ws)], check=True)  # the operator's repository
        prog = (
            'import os; open("uids", "a").write(f"{os.getuid()} {os.getgid()} {os.getgroups()}\\n")'
            '; open("given.txt", "a").write("+run"); import subprocess as s'
            '; open("git", "w").write(str(s.run(["git", "status"]).returncode))'
        )
        armed = '[[trigger]]\ntype = "message"\n'
        start(d, "uid", spec("uid", ws, [sys.executable, "-c", prog]) + armed)
        first_end = wait_event(d, "uid", "run.finished")
        d.stop()
        d.start()
        d.ctl("send", "uid", "again", check=True)
        # the second run's end: its `git` file is written after its line in `uids`
        wait_event(d, "uid", "run.finished", since=first_end["seq"] + 1)
        first, second = (ws / "uids").read_text().splitlines()
        assert first == second
        uid, gid, groups = first.split(" ", 2)
        assert int(uid) in DYNAMIC
        assert int(uid) != os.getuid()
        assert int(uid) == int(gid)
        assert groups == "[]"
        assert (ws / "given.txt").read_text() == "written by the operator+run+run"
        assert os.stat(ws / "given.txt").st_uid == os.getuid()  # still the operator's file
        assert (ws / "git").read_text() == "0"  # git works in the operator's repository
        assert d.json("show", "uid")["boundary"]["uid"] == int(uid)


def test_network_none_leaves_only_the_loopback_interface() -> None:
    with running() as d:
        ws = d.root / "ws"
        ws.mkdir()
        prog = (
            "import json, socket; "
            'open("net.json", "w").write(json.dumps([n for _, n in socket.if_nameindex()]))'
        )
        start(d, "offline", spec("offline", ws, [sys.executable, "-c", prog], 'network = "none"\n'))
        assert wait_event(d, "offline", "run.finished")["data"]["status"] == "ok"
        assert json.loads((ws / "net.json").read_text()) == ["lo"]
        assert len(socket.if_nameindex()) > 1  # the host has more


def test_without_bubblewrap_runs_do_not_start_and_say_why() -> None:
    with running('[run]\nbwrap = "/nonexistent/bwrap"\n') as d:
        ws = d.root / "ws"
        ws.mkdir()
        start(d, "boxless", spec("boxless", ws, ["touch", "ran"]))
        finished = wait_event(d, "boxless", "run.finished")["data"]
        assert finished["status"] == "failed"
        assert "'/nonexistent/bwrap' is not there: install bubblewrap" in finished["error"]
        assert '[run] sandbox = "off"' in finished["error"]
        assert not (ws / "ran").exists()
        blocked = wait_event(
            d, "boxless", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert "bubblewrap" in blocked["data"]["reason"]


def test_the_boundary_off_is_said_by_ps_show_and_metrics() -> None:
    port = free_port()
    off = f'[web]\nlisten = "127.0.0.1:{port}"\n[run]\nsandbox = "off"\n'
    with running(off) as d:
        ws = d.root / "ws"
        ws.mkdir()
        start(d, "bare", spec("bare", ws, ["sh", "-c", "id -u > uid; touch /tmp/sd-bare-$$"]))
        assert wait_event(d, "bare", "run.finished")["data"]["status"] == "ok"
        assert (ws / "uid").read_text().strip() == str(os.getuid())  # unconfined, as the daemon
        [row] = d.json("ps")
        assert row["boundary"] == "off"
        assert "the boundary is off" in d.ctl("ps").stderr
        shown = d.json("show", "bare")
        assert shown["boundary"]["sandbox"] == "off"
        assert "off: runs are not confined" in d.ctl("show", "bare").stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as answer:
            metrics = answer.read().decode()
        assert "sessiond_boundary_sandbox 0.0" in metrics
        page = logged_in(d).get("/")  # the console says it on every page
        assert page.status == 200
        assert b"The boundary is off" in page.body
    with running(f'[web]\nlisten = "127.0.0.1:{port}"\n') as d:
        assert d.json("ping")  # the default: on
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as answer:
            assert "sessiond_boundary_sandbox 1.0" in answer.read().decode()
        ws = d.root / "ws"
        ws.mkdir()
        d.ctl("create", str(d.write_spec("s", spec("s", ws, ["true"]))), check=True)
        [row] = d.json("ps")
        assert row["boundary"] == "sandbox"
        assert "the boundary is off" not in d.ctl("ps").stderr
        assert b"The boundary is off" not in logged_in(d).get("/").body


def test_a_spec_cannot_lift_the_boundary_nor_ask_for_the_gateway_yet() -> None:
    with running() as d:
        ws = d.root / "ws"
        ws.mkdir()
        done = d.ctl(
            "create", str(d.write_spec("lift", spec("lift", ws, ["true"], 'sandbox = "off"\n')))
        )
        assert done.returncode != 0
        assert "a spec cannot lift the boundary; only the operator can" in done.stderr
        done = d.ctl(
            "create", str(d.write_spec("gw", spec("gw", ws, ["true"], 'network = "gateway"\n')))
        )
        assert done.returncode != 0
        assert "reaches the model gateway, and nothing else" in done.stderr
        done = d.ctl(
            "create", str(d.write_spec("rel", spec("rel", ws, ["true"], 'writable = ["cache"]\n')))
        )
        assert done.returncode != 0
        assert "writable: 'cache' is not an absolute path" in done.stderr
        assert d.json("ps") == []


@needs_root
def test_a_program_its_uid_cannot_reach_is_refused_naming_the_folder() -> None:
    hidden = Path(tempfile.mkdtemp(prefix="sd-", dir="/var/tmp"))  # 0700: the operator's only
    try:
        program = hidden / "prog.sh"
        program.write_text("#!/bin/sh\ntouch ran\n")
        os.chmod(program, 0o755)
        with running() as d:
            ws = d.root / "ws"
            ws.mkdir()
            start(d, "locked", spec("locked", ws, [str(program)]))
            finished = wait_event(d, "locked", "run.finished")["data"]
            assert finished["status"] == "failed"
            why = f"cannot run {program}: {hidden} is not searchable by others"
            assert why in finished["error"]
            assert "chmod o+x" in finished["error"]
            assert not (ws / "ran").exists()
    finally:
        shutil.rmtree(hidden)
