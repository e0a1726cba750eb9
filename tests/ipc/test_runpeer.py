"""Telling a run's process on the control socket (sessiond.ipc.runpeer), with real
processes: a peer that cannot be examined, or that is a run's, may only ping."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from sessiond.ipc.runpeer import examine


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
