"""Telling a run's process on the control socket (sessiond.ipc.runpeer), with real
processes: a peer that cannot be examined, or that is a run's, may only ping."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Container

import pytest

from sessiond.ipc import runpeer
from sessiond.ipc.runpeer import ONLY_PING, Examiner, examine, examine_process
from sessiond.sandboxconfig import RunUids


def test_this_process_is_an_operator() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert examine(a, os.getpid(), os.getuid(), frozenset()) is None


def test_a_peer_in_another_pid_namespace_or_gone_may_only_ping() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert "another pid namespace" in (examine(a, 0, os.getuid(), frozenset()) or "")
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()  # reaped: its pid names no process now
        refusal = examine(a, gone.pid, os.getuid(), frozenset()) or ""
        assert "cannot be examined" in refusal


def test_a_process_carrying_a_run_mark_or_of_the_run_user_may_only_ping() -> None:
    a, b = socket.socketpair()
    env = {**os.environ, "SESSIOND_RUN_MARK": "x:y:r1"}
    code = "print('ready', flush=True); input()"
    with a, b, subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE) as marked:  # fmt: skip
        assert marked.stdout is not None
        # running its own code: its exec is over (until then /proc may show no environment)
        assert marked.stdout.readline() == b"ready\n"
        try:
            refusal = examine(a, marked.pid, os.getuid(), frozenset()) or ""
            assert "SESSIOND_RUN_MARK" in refusal
            assert "program endpoint" in refusal
        finally:
            marked.communicate(b"\n", timeout=30)
        by_uid = examine(a, os.getpid(), 65534, frozenset({65534})) or ""
        assert "uid 65534 is a run's uid" in by_uid


def test_an_exited_process_not_yet_reaped_cannot_be_examined() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # exited, not reaped: its /proc entry stays, with no environment to read
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)
        why = examine_process(zombie.pid, os.getuid(), frozenset()) or ""
        assert why == "its process cannot be examined (it has exited)"
    finally:
        zombie.wait()


def test_a_uid_of_the_dynamic_range_is_a_run_s_whatever_else() -> None:
    dynamic = range(458752, 524288)  # the default [run] dynamic_uids
    uids = RunUids(dynamic, frozenset())
    assert 458752 in uids
    assert 524287 in uids
    assert 524288 not in uids
    assert 0 not in uids
    assert os.getuid() not in uids or os.getuid() in dynamic
    a, b = socket.socketpair()
    with a, b:
        why = examine(a, os.getpid(), 460000, uids) or ""
        assert "uid 460000 is a run's uid" in why


def test_a_connection_whose_process_is_gone_is_refused_at_its_next_request() -> None:
    """The verdict is taken at each request, pinned to the process that connected.
    (The peer is no child of this process, which stands for the daemon here: a
    shell starts it in the background and exits, so it is PID 1's.)"""
    folder = tempfile.mkdtemp(prefix="sd-", dir="/tmp")  # a socket path AF_UNIX takes
    path = os.path.join(folder, "s.sock")
    code = (
        "import os, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "print(os.getpid(), flush=True); sys.stdin.readline()"
    )
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        background = 'exec 3<&0; "$0" -c "$1" "$2" <&3 3<&- &'  # its stdin: our pipe
        with subprocess.Popen(["sh", "-c", background, sys.executable, code, path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) as shell:  # fmt: skip
            assert shell.stdout is not None
            assert shell.stdin is not None
            pid = int(shell.stdout.readline())
            shell.wait(30)
            conn, _ = listener.accept()
            examiner = Examiner(conn, pid, os.getuid(), frozenset())
            pidfd = os.pidfd_open(pid)
            try:
                assert examiner.refusal() is None  # alive, and clean: an operator's
                shell.stdin.write(b"\n")
                shell.stdin.close()
                select.select([pidfd], [], [], 30)  # readable once it has exited
                # exited (a zombie until PID 1 reaps it) or gone: either way refused
                assert "its process cannot be examined (it " in (examiner.refusal() or "")
            finally:
                os.close(pidfd)
                examiner.close()
                conn.close()
    shutil.rmtree(folder)


def test_a_child_of_the_daemon_is_no_operator() -> None:
    """What the daemon starts (or adopts: it is a subreaper) is a run's."""
    code = "import sys; print('ready', flush=True); sys.stdin.readline()"
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) as child:  # fmt: skip
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        a, b = socket.socketpair()
        try:
            assert examine(a, child.pid, os.getuid(), frozenset()) == ONLY_PING.format(
                why="it descends from the sessiond daemon itself: it is a process of a run"
            )
        finally:
            a.close()
            b.close()
            child.communicate(b"\n", timeout=30)


def test_a_peer_is_examined_in_full_once_then_only_asked_whether_it_lives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The /proc walk is paid once a connection (it was half of a send's daemon
    CPU when paid at each request); the later requests ask the pidfd."""
    walks: list[int] = []
    walk = runpeer._why_run

    def counted(pid: int, uid: int, run_uids: Container[int]) -> tuple[str | None, bytes]:
        walks.append(pid)
        return walk(pid, uid, run_uids)

    monkeypatch.setattr(runpeer, "_why_run", counted)
    a, b = socket.socketpair()
    examiner = Examiner(a, os.getpid(), os.getuid(), frozenset())
    try:
        assert [examiner.refusal() for _ in range(3)] == [None, None, None]
        assert walks == [os.getpid()]
    finally:
        examiner.close()
        a.close()
        b.close()


def test_without_a_pidfd_the_later_requests_read_the_start_time() -> None:
    """A kernel without SO_PEERPIDFD (before 6.5): each request after the first
    reads the process's stat, and an exited process (a zombie here: this test
    is its parent and has not reaped it) is refused, for good."""
    code = "import sys; sys.stdin.readline()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    assert child.stdin is not None
    a, b = socket.socketpair()
    examiner = Examiner(a, child.pid, os.getuid(), frozenset())
    try:
        examiner.close()  # as if the kernel had given no pidfd
        # judged an operator's (the walk would call this test's child the
        # daemon's: that is test_a_child_of_the_daemon_is_no_operator)
        examiner.judged = True
        assert examiner.refusal() is None
        child.stdin.write(b"\n")
        child.stdin.close()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        refusal = examiner.refusal() or ""
        assert refusal.startswith(
            "this connection may only ping: its process cannot be examined (it has exited)"
        ), refusal
        child.wait()
        assert examiner.refusal() == refusal
    finally:
        if not child.stdin.closed:
            child.stdin.close()  # it ends on its stdin's end
        child.wait()
        a.close()
        b.close()
