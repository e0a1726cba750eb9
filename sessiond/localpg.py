"""A PostgreSQL server of its own, from the machine's binaries: for the tests and
``make cluster`` (DESIGN.md section 10). Not for production: point the nodes at a
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

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast")


def start(folder: Path) -> LocalPostgres:
    """A running server in ``folder`` (made and initialised if new)."""
    server = LocalPostgres(Path(folder).resolve(), bindir())
    server.init()
    server.start()
    return server


def _wait_ready(folder: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Until every node listens (its socket is there), so what is printed works at
    once; a node that exits first is named with its log."""
    import time

    deadline = time.monotonic() + 120
    for i, proc in enumerate(procs, 1):
        sock = folder / f"node{i}" / "sessiond.sock"
        while not sock.exists():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"node{i} exited ({proc.returncode}): see {sock.parent}/sessiond.log"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"node{i} did not listen in 120 s: see {sock.parent}/sessiond.log"
                )
            time.sleep(0.1)  # a tool waiting for a process, not a test


def cluster(folder: Path, nodes: int = 3, lease_ttl: str = "3s") -> int:
    """``make cluster``: a server under ``folder`` and ``nodes`` sessiond nodes on it,
    in the foreground until Ctrl-C; prints what to try."""
    import signal
    import sys

    from sessiond.log.store.pg import schema

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:  # the postgres user must reach its folder inside
        for path in (folder.parent, folder):
            os.chmod(path, os.stat(path).st_mode | 0o111)
    server = start(folder / "postgres")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        schema.migrate(server.dsn)
        for i in range(1, nodes + 1):
            home = folder / f"node{i}"
            home.mkdir(mode=0o700, parents=True, exist_ok=True)
            (home / "sessiond.toml").write_text(
                f'[cluster]\ndsn = "{server.dsn}"\nnode = "node{i}"\nlease_ttl = "{lease_ttl}"\n'
                # one machine: every workspace is on every node's disk, so all fail over
                'shared_paths = ["/"]\n'
            )
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "sessiond.daemon.cli",
                        "--config",
                        str(home / "sessiond.toml"),
                        "--state-dir",
                        str(home / "state"),
                        "--socket",
                        str(home / "sessiond.sock"),
                    ],
                    stderr=open(home / "sessiond.log", "ab"),  # noqa: SIM115 - the child keeps it
                )
            )
        _wait_ready(folder, procs)
        print(f"PostgreSQL: {server.dsn} (log: {folder}/postgres/server.log)")
        for i, proc in enumerate(procs, 1):
            print(f"node{i}: pid {proc.pid}, socket {folder}/node{i}/sessiond.sock")
        other = f"{folder}/node2/sessiond.sock"
        print("Try, in another terminal (Ctrl-C here stops the nodes and the database):")
        print(f"  export PATH={Path(sys.executable).parent}:$PATH")
        print(f"  export SESSIOND_SOCKET={folder}/node1/sessiond.sock")
        print("  sessionctl nodes                 # each node's incarnation, lease, sessions")
        print("  sessionctl create config/sessions/hello.toml && sessionctl activate hello")
        print("  sessionctl log --json hello      # every event names its node and epoch")
        print(f"  SESSIOND_SOCKET={other} sessionctl ps   # any node lists the whole cluster")
        print(
            f"  kill -9 {procs[0].pid}; sleep 5; SESSIOND_SOCKET={other} sessionctl ps"
            f"   # hello moves to another node within lease_ttl ({lease_ttl})"
        )
        # Blocked first (after the nodes started: they must not inherit the mask),
        # so that sigwait takes the signal instead of a handler.
        stops = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        signal.sigwait(stops)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(30)
        server.stop()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(cluster(Path(sys.argv[1] if len(sys.argv) > 1 else "state/cluster")))
