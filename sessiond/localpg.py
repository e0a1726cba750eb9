"""A PostgreSQL server of its own, from the machine's binaries: for the tests and
``make cluster`` (docs/design.md section 10). Not for production: point the nodes at a
real, replicated PostgreSQL there.

The server lives in one folder: ``data/`` (initdb), ``sock/`` (its Unix socket;
it listens on no TCP port) and ``server.log``. Run as root, initdb and postgres
refuse to run, so both run as the ``postgres`` user (``runuser``), and the folder
is handed to that user. fsync stays on: the benchmarks measure real commits.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

SUPERUSER = "sessiond"
DATABASE = "sessiond"


class NoPostgres(Exception):
    """The machine has no PostgreSQL server binaries."""


def bindir() -> Path:
    """Where initdb, pg_ctl and postgres are: on PATH, else Debian's folders (newest)."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    folders = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2] or 0)
    )
    for folder in reversed(folders):
        if os.access(f"{folder}/pg_ctl", os.X_OK):
            return Path(folder)
    raise NoPostgres(
        "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql; "
        "install them (Debian: apt-get install postgresql)"
    )


@dataclass
class LocalPostgres:
    """One server in ``folder``; ``dsn`` reaches database ``sessiond`` on its socket."""

    folder: Path
    bin: Path

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def sock(self) -> Path:
        return self.folder / "sock"

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@/{DATABASE}?host={quote(str(self.sock), safe='')}"

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={quote(str(self.sock), safe='')}"

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(
            cmd, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )

    def init(self) -> None:
        """initdb, once (a folder that has a server already keeps it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (self.folder, self.sock):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        if (self.data / "PG_VERSION").exists():
            return
        done = self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed in {self.data}: {done.stderr.strip()}")

    def start(self) -> None:
        """Start the server (Unix socket only, fsync on) and wait until it answers."""
        options = (
            f"-k {self.sock} -c listen_addresses='' -c fsync=on -c synchronous_commit=on "
            "-c max_connections=300 -c unix_socket_permissions=0700"
        )
        done = self._run(
            str(self.bin / "pg_ctl"),
            "start",
            "-w",
            "-t",
            "120",
            "-D",
            str(self.data),
            "-l",
            str(self.folder / "server.log"),
            "-o",
            options,
        )
        if done.returncode != 0:
            log = (self.folder / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"PostgreSQL did not start in {self.data}: {done.stderr}\n{log}")
        self.createdb(DATABASE)

    def createdb(self, name: str) -> None:
        done = self._run(str(self.bin / "createdb"), "-h", str(self.sock), "-U", SUPERUSER, name)
        if done.returncode != 0 and "already exists" not in done.stderr:
            raise RuntimeError(f"createdb {name} failed: {done.stderr.strip()}")

    def restart_command(self) -> str:
        """What a person types to restart the server (its options are kept)."""
        as_user = "runuser -u postgres -- " if os.geteuid() == 0 else ""
        return f"{as_user}{self.bin / 'pg_ctl'} restart -D {self.data} -m fast"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast")


def start(folder: Path) -> LocalPostgres:
    """A running server in ``folder`` (made and initialised if new)."""
    server = LocalPostgres(Path(folder).resolve(), bindir())
    server.init()
    server.start()
    return server


def _answers(sock: Path) -> bool:
    """A daemon listens on ``sock`` (a file left by a killed one refuses)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(sock))
        except OSError:
            return False
    return True


# Why a node ended, by its exit code (sessiond's: daemon/service.py, cluster/lease.py).
ENDINGS = {
    1: "it could not start",
    2: "its configuration was refused",
    75: "its lease lapsed or the database was away",
}
# A node that keeps ending is started again after 1 s, 2 s, 4 s… at most this long.
BACKOFF_MAX = 10.0


class Node:
    """One node of ``make cluster``: its process, started again whenever it fails."""

    def __init__(self, folder: Path, index: int, dsn: str, lease_ttl: str) -> None:
        import sys

        self.name = f"node{index}"
        self.home = folder / self.name
        self.sock = self.home / "sessiond.sock"
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.home / "sessiond.toml").write_text(
            f'[cluster]\ndsn = "{dsn}"\nnode = "{self.name}"\nlease_ttl = "{lease_ttl}"\n'
            # one machine: every workspace is on every node's disk, so all fail over
            'shared_paths = ["/"]\n'
        )
        self.argv = [
            sys.executable,
            "-m",
            "sessiond.daemon.cli",
            "--config",
            str(self.home / "sessiond.toml"),
            "--state-dir",
            str(self.home / "state"),
            "--socket",
            str(self.sock),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.failures = 0  # in a row, since it last answered: the backoff
        self.again_at: float | None = None  # when to start it again
        self.answering = False

    def start(self) -> None:
        with open(self.home / "sessiond.log", "ab") as log:  # the child keeps its own
            self.proc = subprocess.Popen(self.argv, stderr=log, stdin=subprocess.DEVNULL)
        self.answering = False

    def ending(self, code: int) -> str:
        import signal

        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        why = ENDINGS.get(code, f"see {self.home}/sessiond.log")
        if code == 75:  # its last words say which
            tail = (self.home / "sessiond.log").read_bytes()[-4000:]
            last = tail.rstrip().rsplit(b"\n", 1)[-1]
            if b"database is not reachable" in last:
                why = "the database is not reachable"
            elif b"lease_lost" in last:
                why = "its lease lapsed"
        return f"{code}: {why}"

    def step(self, now: float, say: Callable[[str], None]) -> None:
        """Look at the node once: say when it ended or is back; start it again when due."""
        if self.proc is None:
            if self.again_at is not None and now >= self.again_at:
                self.again_at = None
                self.start()
            return
        code = self.proc.poll()
        if code is None:
            if not self.answering and _answers(self.sock):
                self.answering = True
                if self.failures:
                    say(f"node {self.name} is back (pid {self.proc.pid})")
                self.failures = 0
            return
        self.proc = None
        if code == 0:  # stopped on purpose (SIGTERM, Ctrl-C): as Restart=on-failure
            say(f"node {self.name} stopped (exit 0); not restarting it")
            return
        delay = min(BACKOFF_MAX, 2.0**self.failures)
        self.failures += 1
        self.again_at = now + delay
        say(f"node {self.name} exited ({self.ending(code)}); restarting in {delay:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def reap(self) -> None:
        if self.proc is not None:
            self.proc.wait(30)


def _wait_ready(nodes: list[Node]) -> None:
    """Until every node listens (its socket answers), so what is printed works at
    once; a node that exits first is named with its log."""
    import time

    deadline = time.monotonic() + 120
    for node in nodes:
        assert node.proc is not None
        while not _answers(node.sock):
            if node.proc.poll() is not None:
                raise RuntimeError(
                    f"{node.name} exited ({node.proc.returncode}): see {node.home}/sessiond.log"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{node.name} did not listen in 120 s: see {node.home}/sessiond.log"
                )
            time.sleep(0.1)  # a tool waiting for a process, not a test
        node.answering = True


def cluster(folder: Path, nodes: int = 3, lease_ttl: str = "3s") -> int:
    """``make cluster``: a server under ``folder`` and ``nodes`` sessiond nodes on it,
    in the foreground until Ctrl-C; prints what to try. It supervises the nodes:
    one that fails (a lapsed lease, the database away, killed) is started again,
    after a backoff of at most BACKOFF_MAX, and it says so."""
    import signal
    import sys
    import threading
    import time

    from sessiond.log.store.pg import schema

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:  # the postgres user must reach its folder inside
        for path in (folder.parent, folder):
            os.chmod(path, os.stat(path).st_mode | 0o111)
    server = start(folder / "postgres")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # reset to the default in the nodes (exec)
        signal.signal(sig, lambda *_: stop.set())
    members = [Node(folder, i, server.dsn, lease_ttl) for i in range(1, nodes + 1)]
    try:
        schema.migrate(server.dsn)
        for node in members:
            node.start()
        _wait_ready(members)
        print(f"PostgreSQL: {server.dsn} (log: {folder}/postgres/server.log)")
        for node in members:
            assert node.proc is not None
            print(f"{node.name}: pid {node.proc.pid}, socket {node.sock}")
        other = f"{folder}/node2/sessiond.sock"
        first = members[0].proc
        assert first is not None
        print("Try, in another terminal (Ctrl-C here stops the nodes and the database):")
        print(f"  export PATH={Path(sys.executable).parent}:$PATH")
        print(f"  export SESSIOND_SOCKET={folder}/node1/sessiond.sock")
        print("  sessionctl nodes                 # each node's incarnation, lease, sessions")
        print("  sessionctl create config/sessions/hello.toml && sessionctl activate hello")
        print("  sessionctl log --json hello      # every event names its node and epoch")
        print(f"  SESSIOND_SOCKET={other} sessionctl ps   # any node lists the whole cluster")
        print(
            f"  kill -9 {first.pid}; sleep 5; SESSIOND_SOCKET={other} sessionctl ps"
            f"   # hello moves to another node within lease_ttl ({lease_ttl}),"
            " or node1, started again here, claims it back"
        )
        print("Nodes that exit are started again (and it says so here), after a PostgreSQL")
        print(f"restart too: {server.restart_command()}", flush=True)

        def say(line: str) -> None:
            print(line, flush=True)

        while not stop.is_set():
            now = time.monotonic()
            for node in members:
                node.step(now, say)
            stop.wait(0.2)
    finally:
        for node in members:
            node.stop()
        for node in members:
            node.reap()
        server.stop()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(cluster(Path(sys.argv[1] if len(sys.argv) > 1 else "state/cluster")))
