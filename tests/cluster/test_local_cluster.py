"""``make cluster`` (``python -m sessiond.localpg``): a PostgreSQL and three nodes,
what it prints works as printed, and Ctrl-C leaves nothing running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sessiond.localpg import LocalPostgres, NoPostgres, bindir
from tests.e2e.harness import wait_for

ROOT = Path(__file__).resolve().parents[2]
SESSIONCTL = str(Path(sys.executable).parent / "sessionctl")


def test_make_cluster_prints_what_works_and_ctrl_c_stops_it_all() -> None:
    try:
        bindir()
    except NoPostgres as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {exc}")
        pytest.skip(str(exc))
    # not under pytest's tmp_path: as root the server runs as the postgres user
    folder = Path(tempfile.mkdtemp(prefix="sessiond-mc-")) / "cluster"
    out = folder.parent / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessiond.localpg", str(folder)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "Try, in another" in out.read_text(), timeout=180, what="its advice")
        printed = out.read_text()
        env = {**os.environ, "SESSIOND_SOCKET": str(folder / "node2" / "sessiond.sock")}

        def ctl(*args: str) -> str:
            done = subprocess.run(
                [SESSIONCTL, *args], env=env, capture_output=True, text=True, timeout=60, check=True
            )
            return done.stdout

        nodes = ctl("--json", "nodes")  # every node listens by the time it prints
        assert all(f'"node{i}"' in nodes for i in (1, 2, 3)), nodes
        env["SESSIOND_SOCKET"] = str(folder / "node1" / "sessiond.sock")
        ctl("create", str(ROOT / "config" / "sessions" / "hello.toml"))
        env["SESSIOND_SOCKET"] = str(folder / "node2" / "sessiond.sock")
        assert "hello  node1" in ctl("ps")  # as printed: any node lists the cluster
        assert f"export PATH={Path(sys.executable).parent}:$PATH" in printed
        pids = [
            int(line.split()[2].rstrip(",")) for line in printed.splitlines() if " pid " in line
        ]
        assert len(pids) == 3
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=120) == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert not (folder / "postgres" / "data" / "postmaster.pid").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        LocalPostgres(folder / "postgres", bindir()).stop()  # pg_ctl detached it
        shutil.rmtree(folder.parent, ignore_errors=True)


def test_make_cluster_restarts_a_node_that_exits_and_the_nodes_after_a_postgres_restart() -> None:
    """The supervisor: a node killed comes back, and says so; a PostgreSQL restart
    ends every node (their leases cannot be renewed: exit 75), and they come back
    when the database does. Waits on what it prints and on sockets answering."""
    try:
        binaries = bindir()
    except NoPostgres as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {exc}")
        pytest.skip(str(exc))
    folder = Path(tempfile.mkdtemp(prefix="sessiond-mc-")) / "cluster"
    out = folder.parent / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessiond.localpg", str(folder)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )

    def said(line: str) -> int:
        return out.read_text().count(line)

    def ps(node: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "SESSIOND_SOCKET": str(folder / node / "sessiond.sock")}
        return subprocess.run(
            [SESSIONCTL, "ps"], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    try:
        wait_for(lambda: "Try, in another" in out.read_text(), timeout=180, what="its advice")
        assert "pg_ctl restart -D" in out.read_text()
        pid = next(
            int(line.split()[2].rstrip(","))
            for line in out.read_text().splitlines()
            if line.startswith("node2: pid ")
        )
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: said("node node2 exited (killed by SIGKILL); restarting in 1 s"),
            timeout=30,
            what="the supervisor to see node2 end",
        )
        wait_for(lambda: said("node node2 is back"), timeout=120, what="node2 back")
        assert ps("node2").returncode == 0

        server = LocalPostgres(folder / "postgres", binaries)
        server.stop()
        for node in ("node1", "node2", "node3"):
            wait_for(
                lambda node=node: said(f"node {node} exited (75: "),
                timeout=60,
                what=f"{node} to end without its database",
            )
        back = {node: said(f"node {node} is back") for node in ("node1", "node2", "node3")}
        server.start()
        for node, before in back.items():
            wait_for(
                lambda node=node, before=before: said(f"node {node} is back") > before,
                timeout=120,
                what=f"{node} back with its database",
            )
            done = ps(node)
            assert done.returncode == 0, done.stderr
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=120) == 0
        print(out.read_text())  # what a person sees, in pytest's report
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        LocalPostgres(folder / "postgres", bindir()).stop()
        shutil.rmtree(folder.parent, ignore_errors=True)
