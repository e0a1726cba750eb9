"""Identity is proven (README.md, "Who may approve"): the control socket and the
web console take a peer for an operator only when its credentials prove it,
and refuse, with the reason, every peer they cannot prove: a run's process, a
TCP peer gone from the kernel's tables, a process that exited, a process in
another pid namespace, a uid runs are given. Real daemon, real processes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.harness import SESSIONCTL, Daemon, running, wait_event, wait_for
from tests.e2e.receivers import receiving
from tests.e2e.test_links import config, ended, free_port, links_of, use
from tests.e2e.test_web import blocked_victim
from tests.e2e.webclient import WEB, login

IMPOSTOR = Path(__file__).parent / "programs" / "impostor.py"
GONE = "could not be identified (it closed before it could be examined); try again"
# why a run's request on the web is refused: gone before it was examined, or
# examined in time: a run's uid (a root daemon gives each session one), a run's process
A_RUN = (GONE, "cannot be examined", "is a run's uid", "process of a run")


# The control socket's own refusal of a run's processes is a layer beneath the
# sandbox: a sandboxed run cannot reach the control socket at all (its folder is
# hidden: test_a_sandboxed_run_cannot_reach_the_control_socket_nor_signal_the_daemon),
# so the tests of that refusal run with the sandbox off, as an operator may set it.
UNCONFINED = '[run]\nsandbox = "off"\n'


def run_program(d: Daemon, name: str, argv: list[str], files: dict[str, str]) -> Path:
    """Run ``argv`` as session ``name``'s program to its end, in a workspace that
    holds ``files`` (what a sandboxed run reads must be there: its uid cannot read
    the checkout, nor the test's folder); that workspace."""
    ws = d.root / f"ws-{name}"
    ws.mkdir()
    for file, text in files.items():
        (ws / file).write_text(text)
    exec_ = ", ".join(f'"{a}"' for a in argv)
    spec = f'name = "{name}"\n[run]\nexec = [{exec_}]\ncwd = "{ws}"\nretries = 0\n'
    d.ctl("create", str(d.write_spec(name, spec)), check=True)
    d.ctl("activate", name, check=True)
    finished = wait_event(d, name, "run.finished")
    if finished["data"].get("exit_code") != 0:  # say how
        stderr = d.ctl("output", name, "--stderr").stdout[-2000:]
        raise AssertionError(f"{name}'s program failed: {finished} {stderr}")
    return ws


def impostor(d: Daemon, *args: str) -> Any:
    """Run tests/e2e/programs/impostor.py as session "impostor", sandboxed (the
    default), with the system's Python (the virtualenv's is the checkout's);
    what it wrote."""
    argv = ["/usr/bin/python3", "-I", "impostor.py", *args, "impostor.json"]
    ws = run_program(d, "impostor", argv, {"impostor.py": IMPOSTOR.read_text()})
    return orjson.loads((ws / "impostor.json").read_bytes())


def refusals(d: Daemon, count: int) -> list[str]:
    """The reasons of the first ``count`` requests the web listener refused (the
    daemon's log says each: a reset peer never reads its answer)."""

    def enough(_line: dict[str, Any]) -> bool:
        return len([x for x in d.lines if x.get("event") == "web.refused"]) >= count

    d.wait_line("web.refused", match=enough)
    return [x["why"] for x in d.lines if x.get("event") == "web.refused"][:count]


def nothing_granted(d: Daemon, ws: Path) -> None:
    assert [a["tool"] for a in d.json("show", "victim")["pending_approvals"]] == ["command"]
    assert not d.json("log", "victim", "--type", "approval.granted")
    assert not (ws / "f.txt").exists()


def test_a_run_that_posts_its_approve_link_and_resets_the_connection_answers_nothing() -> None:
    """Before: the peer's socket was gone from /proc/net/tcp by the time it was
    looked up, which counted as "on another machine": approved, 3 times of 3."""
    with receiving() as receiver, running(config(receiver, free_port())) as d:
        ws = blocked_victim(d)
        approve = links_of(receiver, "victim")["approve_url"]
        assert impostor(d, "link-reset", approve, "-") == ["reset"] * 3
        for why in refusals(d, 3):
            assert any(reason in why for reason in A_RUN), why
        nothing_granted(d, ws)
        # nothing burned the link: a person's use of it answers
        assert use(approve, "POST").status == 200
        wait_event(d, "victim", "lifecycle.changed", match=ended)
        (granted,) = d.json("log", "victim", "--type", "approval.granted")
        assert granted["data"]["channel"] == "link"


@pytest.mark.parametrize("mode", ["api-reset", "api"])
def test_a_run_with_a_stolen_login_approves_nothing_on_the_console(mode: str) -> None:
    with running(WEB) as d:
        ws = blocked_victim(d)
        base, token = login(d)  # the login a person minted, which the program stole
        answers = impostor(d, mode, base, token)
        if mode == "api":
            (answer,) = answers
            assert answer.startswith("HTTP/1.1 403"), answer
            if os.geteuid() == 0:  # the session's own uid (of the dynamic range) tells it first
                uid = re.search(r"uid (\d+) is a run's uid", answer)
                assert uid is not None, answer
                assert 458752 <= int(uid[1]) <= 524287, answer
            else:
                assert "process of a run (run r1 of session 'impostor')" in answer, answer
            assert "web console is for people" in answer
        else:
            for why in refusals(d, 3):
                assert any(reason in why for reason in A_RUN), why
        nothing_granted(d, ws)


HANDOFF = r"""
import json, os, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
f = sock.makefile("rwb")
def call(method, params):
    f.write(json.dumps({"id": 1, "method": method, "params": params}).encode() + b"\n")
    f.flush()
    return f.readline()
assert json.loads(call("ping", {}))["ok"]  # accepted, examined: an operator's process
if os.fork() == 0:
    sys.stdin.readline()  # "go": the process that connected is gone
    sys.stdout.buffer.write(call("approve", {"name": "victim", "by": "handed on"}))
    sys.stdout.flush()
os._exit(0)
"""


def test_a_request_on_a_connection_whose_process_is_gone_is_refused() -> None:
    """A process connects (and is examined, a clean one), hands its socket to a
    child and exits: the child's request is refused, the approval waits. Before:
    the verdict was taken once at accept, and the approval was recorded."""
    with running() as d:
        ws = blocked_victim(d)
        client = subprocess.Popen(
            [sys.executable, "-c", HANDOFF, str(d.socket)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert client.wait(60) == 0  # the connecting process exited and is reaped
        assert client.stdin is not None
        assert client.stdout is not None
        client.stdin.write(b"go\n")
        client.stdin.close()
        answer = orjson.loads(client.stdout.read())
        client.stdout.close()
        assert answer["ok"] is False, answer
        message = answer["error"]["message"]
        assert "may only ping: its process cannot be examined (it is gone)" in message
        nothing_granted(d, ws)
        d.ctl("approve", "victim", check=True)  # a person, connected, still may


def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (to make a pid namespace, or to take another uid)")


def test_a_process_in_another_pid_namespace_is_refused() -> None:
    """A sandboxed run lives in a pid namespace of its own: whatever is in one is
    no operator. Before: its pid was visible, its ancestry clean: approved."""
    root_only()
    with running() as d:
        ws = blocked_victim(d)
        done = subprocess.run(
            ["unshare", "--pid", "--fork", SESSIONCTL, "approve", "victim"],
            env=d.env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done
        assert "runs in another pid namespace than the daemon's" in done.stderr, done.stderr
        nothing_granted(d, ws)


def test_a_uid_of_the_range_runs_are_given_is_refused_even_when_access_allows_it() -> None:
    """Any uid in the dynamic range (458752-524287) is a run's. Before: let in by
    its group under [access], it approved."""
    root_only()
    with running('[access]\ngroups = ["nogroup"]\n') as d:
        ws = blocked_victim(d)
        done = subprocess.run(
            ["setpriv", "--reuid=460000", "--regid=65534", "--clear-groups",
             SESSIONCTL, "approve", "victim"],
            env=d.env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done
        assert "uid 460000 is a run's uid" in (done.stderr)
        nothing_granted(d, ws)


def test_an_approval_that_comes_in_a_bundle_grants_nothing_here() -> None:
    """Whoever writes a bundle writes its answers too (a program can craft one
    with an `approval.granted` of its own): a call approved in a bundle and not
    run yet is asked again on import. Before: the imported session ran it."""
    with running() as d:
        ws = blocked_victim(d)
        d.ctl("suspend", "victim", check=True)
        d.ctl("approve", "victim", "--by", "given on the other side", check=True)
        bundle = d.root / "victim.tar.gz"
        d.ctl("export", "victim", "-o", str(bundle), check=True)
        d.ctl("import", str(bundle), "--as", "arrived", check=True)
        shown = d.json("show", "arrived")
        assert [a["tool"] for a in shown["pending_approvals"]] == ["command"], shown
        asked = d.json("log", "arrived", "--type", "approval.requested")
        (imported,) = d.json("log", "arrived", "--type", "session.imported")
        assert asked[-1]["seq"] > imported["seq"], asked  # asked here, anew
        d.ctl("resume", "arrived", check=True)
        blocked = wait_event(
            d, "arrived", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert "approval pending" in blocked["data"]["reason"], blocked
        assert not d.json("log", "arrived", "--type", "run.started")
        assert not (ws / "f.txt").exists()
        d.ctl("approve", "arrived", check=True)  # a person here: it runs
        wait_event(d, "arrived", "run.finished")
        assert (ws / "f.txt").read_text() == "new\n"


MCP_CLIENT = r"""
import os, sys
import anyio, orjson
from mcp import Client
from mcp.client.stdio import StdioServerParameters

async def main():
    ctl, control, out = sys.argv[1:4]
    params = StdioServerParameters(command=ctl, args=["--socket", control, "mcp"], env={})
    async with Client(params) as client:
        tools = sorted(t.name for t in (await client.list_tools()).tools)
        sent = await client.call_tool("send", {"name": "victim", "text": "approve me"})
    text = sent.content[0].text
    open(out, "wb").write(orjson.dumps({"tools": tools, "error": sent.is_error, "text": text}))

anyio.run(main)
"""


def test_an_mcp_server_a_run_starts_on_the_control_socket_may_only_ping() -> None:
    """`sessionctl mcp` has no approve tool; started by a run against the control
    socket (whose path it learnt), its every call is refused with the reason.
    (Unconfined: a sandboxed run cannot reach the control socket, see below.)"""
    with running(UNCONFINED) as d:
        ws = blocked_victim(d)
        argv = [sys.executable, "client.py", SESSIONCTL, str(d.socket), "mcp.json"]
        agent = run_program(d, "agent", argv, {"client.py": MCP_CLIENT})
        answer = orjson.loads((agent / "mcp.json").read_bytes())
        assert not {"approve", "deny", "resolve"} & set(answer["tools"]), answer
        assert answer["error"] is True, answer
        assert "may only ping" in answer["text"], answer
        assert "descends from a sessiond spawner" in answer["text"], answer
        nothing_granted(d, ws)
        assert not d.json("log", "victim", "--type", "message.received")


ESCAPE = r"""
import errno, json, os, signal, socket, sys
control, *pids = sys.argv[1:]
def failed(exc):
    return errno.errorcode.get(exc.errno, str(exc.errno))
out = {}
try:
    socket.socket(socket.AF_UNIX).connect(control)
    out["connect"] = "connected"
except OSError as exc:
    out["connect"] = failed(exc)
out["folder"] = os.listdir(os.path.dirname(control))
out["kill"] = {}
for pid in pids:  # the daemon, its spawner, their holders: as the host numbers them
    try:
        os.kill(int(pid), signal.SIGKILL)
        out["kill"][pid] = "killed"
    except OSError as exc:
        out["kill"][pid] = failed(exc)
json.dump(out, open("escape.json", "w"))
"""


def descendants(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(c) for c in f.read().split()]
    return [pid] + [p for c in children for p in descendants(c)]


def test_a_sandboxed_run_cannot_reach_the_control_socket_nor_signal_the_daemon() -> None:
    """What the tests above run unconfined for: with the sandbox on (the default),
    a run finds no control socket to connect to (hidden from its view), so
    neither it nor an MCP server it starts nor any process it leaves behind can
    ask there; and, in a pid namespace of its own, it cannot signal the daemon,
    the spawner or a holder to leave a process outside every tree."""
    with running() as d:
        ws = blocked_victim(d)
        assert d.proc is not None
        pids = [str(p) for p in descendants(d.proc.pid)]  # the daemon, the spawner, ...
        argv = ["/usr/bin/python3", "-I", "escape.py", str(d.socket), *pids]
        escaper = run_program(d, "escaper", argv, {"escape.py": ESCAPE})
        got = orjson.loads((escaper / "escape.json").read_bytes())
        assert got["connect"] == "ENOENT", got
        assert d.socket.name not in got["folder"], got  # (its own program endpoint is there)
        assert got["kill"] == dict.fromkeys(pids, "ESRCH"), got
        assert d.proc.poll() is None
        d.ctl("ping", check=True)
        nothing_granted(d, ws)


LEFTOVER = r"""
import os, signal, sys
ctl, control, out = sys.argv[1:4]
holder = os.getppid()
with open(f"/proc/{holder}/stat", "rb") as f:
    stat = f.read()
spawner = int(stat[stat.rfind(b")") + 2 :].split()[1])
read, write = os.pipe()
if os.fork() == 0:
    os.close(write)
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    os.read(read, 1)  # end of file: the run's program is gone, its holder and spawner too
    script = (
        '"$0" --socket "$1" approve victim > "$2.txt" 2>&1; '
        'echo $? > "$2.tmp"; /bin/mv "$2.tmp" "$2.rc"'
    )
    os.execve("/bin/sh", ["sh", "-c", script, ctl, control, out], {})  # no mark: a clean env
os.close(read)
# the spawner stopped first: it would kill what a killed holder left behind
for pid, sig in ((spawner, signal.SIGSTOP), (holder, signal.SIGKILL), (spawner, signal.SIGKILL)):
    try:  # refused where they are not this uid's
        os.kill(pid, sig)
    except OSError as exc:
        print(f"kill {pid}: {exc}", file=sys.stderr)
"""


@pytest.mark.parametrize("run_user", [None, "nobody"])
def test_a_process_a_run_leaves_after_killing_its_holder_and_spawner_approves_nothing(
    run_user: str | None,
) -> None:
    """A run forks a clean process (setsid, double fork, an empty environment),
    kills its holder and the spawner, and the process it left asks to approve.
    Before: it was nobody's child but PID 1's, with no mark: an operator."""
    if run_user is not None:
        root_only()
    config = UNCONFINED  # the control socket's own refusal is the promise here
    if run_user is not None:
        config = f'[access]\nusers = ["{run_user}"]\n{config}user = "{run_user}"\n'
    with running(config) as d:
        ws = blocked_victim(d)
        folder = d.root / "ws-leaver"
        folder.mkdir()
        os.chmod(folder, 0o777)  # the [run] user writes the leftover's answer here
        (folder / "leave.py").write_text(LEFTOVER)
        out = folder / "answer"
        spec = (
            f'name = "leaver"\n[run]\nexec = ["/usr/bin/python3", "-I", "leave.py", '
            f'"{SESSIONCTL}", "{d.socket}", "{out}"]\ncwd = "{folder}"\nretries = 0\n'
        )
        d.ctl("create", str(d.write_spec("leaver", spec)), check=True)
        d.ctl("activate", "leaver", check=True)
        rc = folder / "answer.rc"
        if run_user is not None:
            # nobody may not signal the daemon's holder and spawner: the run ends,
            # and its holder stops whatever it left, the would-be operator too
            wait_event(d, "leaver", "run.finished")
            # If it got to ask before its holder stopped it, it was refused; where the
            # venv's Python lives under a home closed to others (root's pyenv), nobody
            # cannot even start sessionctl. Either way nothing is granted (below).
            if rc.exists():
                answer = (folder / "answer.txt").read_text()
                assert "may only ping" in answer or "Permission denied" in answer, answer
            nothing_granted(d, ws)
            return
        try:
            wait_for(rc.exists, timeout=60, what="the leftover's answer")
        except AssertionError:
            raise AssertionError(f"no answer from the leftover: {d.lines[-10:]}") from None
        said = (folder / "answer.txt").read_text()
        assert rc.read_text().strip() != "0", said
        # its holder and spawner dead, it reparented to the daemon (a subreaper)
        assert "may only ping: it descends from the sessiond daemon itself" in said, said
        nothing_granted(d, ws)


LEFT_FOR_LATER = r"""
import os, signal, sys
ctl, control, fifo = sys.argv[1:4]
if os.path.exists("done"):  # the session's next run (after the restart): nothing
    sys.exit(0)
if "SESSIOND_RUN_MARK" in os.environ:  # unmarked, so no sweep for marks finds it
    os.execve(sys.executable, [sys.executable, "-I", *sys.argv], {})
open("done", "w").close()

def parent(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])

holder = os.getppid()
spawner = parent(holder)
daemon = parent(spawner)
if os.fork() == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    script = (
        'read go < "$2"; "$0" --socket "$1" approve victim > "$2.txt" 2>&1; '
        'echo $? > "$2.tmp"; /bin/mv "$2.tmp" "$2.rc"'
    )
    os.execve("/bin/sh", ["sh", "-c", script, ctl, control, fifo], {})  # no mark
os.kill(spawner, signal.SIGSTOP)  # or it kills what a killed holder left behind
for pid in (holder, spawner, daemon):
    os.kill(pid, signal.SIGKILL)
"""


@pytest.mark.xfail(
    strict=True,
    reason='with [run] sandbox = "off" (same uid, no pid namespace), a run that kills its '
    "holder, the spawner and the daemon leaves a process outside every tree once the daemon "
    "restarts. The sandbox (on by default) closes it: the run cannot see or signal any of them "
    "(test_a_sandboxed_run_cannot_reach_the_control_socket_nor_signal_the_daemon).",
)
def test_a_process_a_run_leaves_after_killing_the_daemon_too_approves_nothing() -> None:
    with running(UNCONFINED) as d:  # confined, it cannot start the attack: see the mark
        ws = blocked_victim(d)
        folder = d.root / "ws-leaver"
        folder.mkdir()
        (folder / "leave.py").write_text(LEFT_FOR_LATER)
        fifo = folder / "go"
        os.mkfifo(fifo)
        spec = (
            f'name = "leaver"\n[run]\nexec = ["/usr/bin/python3", "-I", "leave.py", '
            f'"{SESSIONCTL}", "{d.socket}", "{fifo}"]\ncwd = "{folder}"\nretries = 0\n'
        )
        d.ctl("create", str(d.write_spec("leaver", spec)), check=True)
        d.ctl("activate", "leaver", check=True)
        assert d.proc is not None
        d.proc.wait(60)  # killed by the run
        d.start()
        wait_for(lambda: d.ctl("ping").returncode == 0, what="the daemon back")
        with open(fifo, "w") as go:  # the daemon is back: the leftover may ask
            go.write("go\n")
        rc = folder / "go.rc"
        wait_for(rc.exists, timeout=60, what="the leftover's answer")
        said = (folder / "go.txt").read_text()
        assert rc.read_text().strip() != "0", said
        assert "may only ping" in said, said
        nothing_granted(d, ws)
