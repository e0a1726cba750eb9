"""Stops a test run's PostgreSQL when the test run dies without stopping it.

``pg_ctl start`` detaches the server from the test's process group, so a pytest
killed by its group (a CI job stopped early, kill -9) would leave the server
running. The fixture starts this watcher in a session of its own with a pipe
on its stdin: a clean finish writes ``done`` and the watcher exits quietly; an
end of file without it means the test process is gone, and the watcher stops
the server (``immediate``: nothing of a test database is worth a checkpoint)
and removes its folder.

Usage: python -m tests.pgwatch FOLDER BINDIR
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from sessiond.localpg import LocalPostgres


def main(folder: str, bindir: str) -> int:
    said = sys.stdin.read()  # blocks until the test process closes or dies
    if said.strip() == "done":
        return 0
    server = LocalPostgres(Path(folder), Path(bindir))
    if (server.data / "postmaster.pid").exists():
        server._run(str(server.bin / "pg_ctl"), "stop", "-D", str(server.data), "-m", "immediate")
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
