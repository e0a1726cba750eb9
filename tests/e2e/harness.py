"""Run the real `sessiond` process and drive it with the real `sessionctl`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from tests.patience import Patience

BIN = Path(sys.executable).parent
SESSIOND = str(BIN / "sessiond")
SESSIONCTL = str(BIN / "sessionctl")
# Put before a command line that a test ends with Ctrl-C (SIGINT): the command
# runs with SIGINT's default action, as at a terminal. A suite started in the
# background (a shell's `cmd &`) ignores SIGINT, every child inherits that, and
# Python then never raises KeyboardInterrupt, so the Ctrl-C would do nothing.
AT_A_TERMINAL = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]
# A wall-clock bound in these tests only catches a hang: it never decides an
# outcome a busy machine could change. A test's own bound is a floor raised to
# this (two suites at once on two cores have made 30 s waits run out on good code),
# the waits that count only the daemon's runnable seconds (tests/patience.py)
# included: the daemon may wait, not runnable, on what is starved instead (its
# run's program, PostgreSQL, a scripted upstream in the test's own process).
HANG = float(os.environ.get("SESSIOND_TEST_HANG", "180"))
READY_TIMEOUT = HANG  # an exit wakes the waiter at once (_read_log)
LIVE: set[Daemon] = set()  # started and not yet reaped: see conftest.py
# every daemon started since a conftest last cleared it (tests/cluster/conftest.py
# shows a failed test's nodes' lease events from it, after they were reaped)
STARTED: list[Daemon] = []


def short_dir() -> Path:
    """A folder whose socket path fits AF_UNIX's 108 bytes (pytest's tmp_path may not)."""
    return Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp"))


def closed_to_others(path: Path) -> Path | None:
    """The first folder on the way to ``path`` (``path`` itself, if a folder) that
    other users cannot search, or None: what a program run as another uid (``[run]
    user``) would stop at."""
    path = path.absolute()
    for folder in [*reversed(path.parents), *([path] if path.is_dir() else [])]:
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


@contextmanager
def readable_by_others(*programs: Path) -> Iterator[list[Path]]:
    """Copies of ``programs`` that any uid can read, in a folder of their own under
    /tmp, removed at the end.

    A test that runs a program as another user (``[run] user``) must not run it
    from the checkout: a clone in a folder closed to others (mode 0700, as
    ``mktemp -d`` makes, and as many home folders are) is unreadable to that user,
    and the run fails with "Permission denied" instead of testing anything. The
    copies must not need the checkout either: run them with the system's
    interpreter (``/usr/bin/python3 -I``), not the virtualenv's, which lives in the
    checkout too."""
    folder = Path(tempfile.mkdtemp(prefix="sd-prog-", dir="/tmp"))
    try:
        os.chmod(folder, 0o755)
        copies = []
        for program in programs:
            copy = folder / program.name
            shutil.copyfile(program, copy)
            os.chmod(copy, 0o755 if os.access(program, os.X_OK) else 0o644)
            copies.append(copy)
        closed = closed_to_others(folder)
        assert closed is None, f"{closed} is closed to others: no other uid can read {folder}"
        yield copies
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Daemon:
    """One sessiond process on its own state dir and socket."""

    def __init__(
        self,
        root: Path,
        config: str = "",
        env: dict[str, str] | None = None,
        *,
        relative_socket: bool = False,
    ) -> None:
        self.root = root
        # started from root with `--socket s.sock` (and no SESSIOND_SOCKET), as a person
        # may type it; sessionctl here still gets the absolute path
        self.relative_socket = relative_socket
        self.state_dir = root / "state"
        # in a folder of its own, as /run/sessiond is: never the workspace of a
        # session (a run's uid is let write its workspace, never the socket's folder)
        self.socket = root / "sock" / "s.sock"
        os.chmod(root, 0o711)  # searchable: the socket's folder lets in whom its ACL names
        self.config = root / "sessiond.toml"
        self.config.write_text(
            'log_format = "json"\nstop_grace = "2s"\nshutdown_grace = "3s"\n' + config
        )
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        # what starts it (the fault self-test puts a wrapper that breaks it here)
        self.command: list[str] = [SESSIOND]
        self.lines: list[dict[str, Any]] = []
        self._lines_changed = threading.Condition()
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIOND_")}
        env.update(self.extra_env)
        env["SESSIOND_SOCKET"] = str(self.socket)
        env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"  # sessionctl for programs
        return env

    def start(self, *, wait: bool = True) -> Daemon:
        if self.proc is not None:  # an earlier run of this daemon (it may have died)
            self.proc.wait(30)
            if self._reader is not None:
                self._reader.join(5)
            # (a reader still blocked: something the dead daemon left holds its stderr;
            # closing the pipe under that read would block this thread too)
            if self.proc.stderr is not None and not (self._reader and self._reader.is_alive()):
                self.proc.stderr.close()
        # An event of this start's own: the reader of an earlier daemon's stderr may
        # end only now (what that daemon left held the pipe until the new one's
        # recovery stopped it), and must not take the new daemon for ready.
        self._ready = threading.Event()
        env = self.env
        if self.relative_socket:
            del env["SESSIOND_SOCKET"]
        self.proc = subprocess.Popen(
            [
                *self.command,
                "--config",
                str(self.config),
                "--state-dir",
                str(self.state_dir),
                "--socket",
                str(self.socket.relative_to(self.root) if self.relative_socket else self.socket),
            ],
            env=env,
            cwd=self.root if self.relative_socket else None,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        LIVE.add(self)
        if self not in STARTED:
            STARTED.append(self)
        self._reader = threading.Thread(
            target=self._read_log, args=(self.proc, self._ready), daemon=True
        )
        self._reader.start()
        if wait:
            self.wait_ready()
        return self

    def _read_log(self, proc: subprocess.Popen[bytes], ready: threading.Event) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                line = {"event": "raw", "text": raw.decode(errors="replace").strip()}
            with self._lines_changed:
                self.lines.append(line)
                self._lines_changed.notify_all()
            if line.get("event") == "daemon.ready":
                ready.set()
        ready.set()  # exited: wake the waiter, which then sees the exit
        # At its end the pipe is this reader's to close: a restart does not wait for
        # it (see start), and a pipe left open is a ResourceWarning, made an error,
        # in whichever later test the garbage collector happens to run.
        proc.stderr.close()
        with self._lines_changed:
            self._lines_changed.notify_all()

    def wait_line(
        self, event: str, *, match: Any = None, since: int = 0, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Wait for the daemon's own log line ``event`` (and ``match(line)``), from
        line ``since`` on: woken by each line read, never polled. ``timeout``
        (raised to HANG) counts only the seconds the daemon could run
        (tests/patience.py): a busy machine is no failure."""
        assert self.proc is not None
        patience = Patience(self.proc.pid, quiet=max(timeout, HANG))

        def found() -> dict[str, Any] | None:
            for line in self.lines[since:]:
                if line.get("event") == event and (match is None or match(line)):
                    return line
            return None

        with self._lines_changed:
            while (line := found()) is None:
                left = patience.left()
                if left <= 0 or (self._reader is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no {event!r} line from sessiond: {self.lines[-20:]}")
                self._lines_changed.wait(min(left, 1.0))  # then look at the clock again
            return line

    def wait_ready(self) -> None:
        """Wait for the daemon's own "daemon.ready" log line (no polling of the socket)."""
        assert self.proc is not None
        if not self._ready.wait(READY_TIMEOUT):
            raise AssertionError(f"sessiond did not get ready in {READY_TIMEOUT}s: {self.lines}")
        said_ready = any(line.get("event") == "daemon.ready" for line in self.lines)
        if not said_ready:
            # woken by the end of its stderr: the daemon is exiting, but may not have
            # exited yet (poll() would still say None), so wait for its exit code
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(READY_TIMEOUT)
        if not said_ready or self.proc.poll() is not None:
            raise AssertionError(f"sessiond exited with {self.proc.poll()}: {self.lines}")

    def ctl(
        self, *args: str, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [SESSIONCTL, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=max(timeout, HANG),
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"sessionctl {' '.join(args)} -> {done.returncode}: {done.stderr}")
        return done

    def json(self, *args: str) -> Any:
        done = self.ctl("--json", *args, check=True)
        return orjson.loads(done.stdout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(max(timeout, HANG))  # a stop under load may take long
        if self._reader is not None:
            self._reader.join(5)
        if self.proc.stderr is not None and not (self._reader and self._reader.is_alive()):
            self.proc.stderr.close()  # (not under a read still blocked: see start)
        return code

    def reap(self) -> bool:
        """Kill a daemon that a failing test left running (its whole process
        group). True if one was still running."""
        LIVE.discard(self)
        if self.proc is None or self.proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.stop(signal.SIGKILL)
        return True

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def write_spec(self, name: str, text: str) -> Path:
        path = self.root / f"{name}.toml"
        path.write_text(text)
        return path


@contextmanager
def running(config: str = "", env: dict[str, str] | None = None) -> Iterator[Daemon]:
    root = short_dir()
    daemon = Daemon(root, config, env)
    try:
        yield daemon.start()
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def held_daemon(point: str, extra: str = "") -> Iterator[Daemon]:
    """A daemon (not started) whose starts wait at the test-only hold ``point``
    while ``root/go`` is missing (it exists for the first start, which goes
    straight through); ``extra``: more of its configuration. Stopped and removed
    after."""
    root = short_dir()
    go = root / "go"
    go.touch()
    d = Daemon(root, f'fault_hold = "{point}"\nfault_hold_until = "{go}"\n{extra}')
    try:
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def wait_for(predicate: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """Wait for an outcome the test cannot subscribe to (a child's exit seen via ctl).

    Bounded, with a growing interval; used only where no event exists to wait on.
    """
    deadline = time.monotonic() + max(timeout, HANG)
    delay = 0.01
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def wait_event(
    daemon: Daemon,
    session: str,
    etype: str,
    *,
    since: int = 1,
    match: Any = None,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """Follow a session's log with the real `sessionctl log --follow` until an event
    of type ``etype`` (and ``match(record)``) appears; return it. ``timeout``
    (raised to HANG) counts only the seconds the daemon could run (tests/patience.py)."""
    proc = subprocess.Popen(
        [SESSIONCTL, "--json", "log", session, "--follow", "--since", str(since), "--type", etype],
        env=daemon.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    found: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            record = orjson.loads(raw)
            if match is None or match(record):
                found.append(record)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert daemon.proc is not None
    patience = Patience([daemon.proc.pid, proc.pid], quiet=max(timeout, HANG))
    while reader.is_alive() and (left := patience.left()) > 0:
        reader.join(min(left, 1.0))  # then look at the clock again
    proc.kill()
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    if not found:
        raise AssertionError(
            f"no {etype} event in {session} within {max(timeout, HANG)}s of the daemon's"
        )
    return found[0]


def alive(pid: int) -> bool:
    """Running (a zombie left for init to reap does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    end = stat.rfind(b")")
    return stat[end + 2 : end + 3] != b"Z"
