"""The cluster's figures that only real nodes give (``python -m sessiond.bench.cluster
--nodes``): real ``sessiond`` processes on the bench's PostgreSQL.

- **Cross-node wake, end to end**: ``send`` through node n1's socket to a session
  that runs on node n2, until the first instruction of the program its message
  trigger starts there (``bash -c 'echo $EPOCHREALTIME > ts'``). Beside it, in
  turn, the same ``send`` through n2's own socket: the wake on one node, so the
  difference is what crossing nodes costs (the ``messages`` row, its NOTIFY, the
  owner's read).
- **Failover, several rounds**: kill -9 of the node that owns a session until
  another node logs ``cluster.taken_over`` for it; the killed node is started
  again (a new incarnation) and the next round kills the new owner.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from sessiond.bench.daemon import BIN, call
from sessiond.localpg import LocalPostgres

TTL = 2.0  # lease_ttl of the nodes, as in the tests


class Node:
    """One ``sessiond`` of the cluster; its JSON log lines are kept as they come."""

    def __init__(self, root: Path, dsn: str, name: str) -> None:
        self.root = root
        self.name = name
        self.socket = root / "s.sock"
        root.mkdir(parents=True, exist_ok=True)
        self.config = root / "sessiond.toml"
        self.config.write_text(
            f'log_format = "json"\nlog_level = "info"\n[cluster]\ndsn = "{dsn}"\n'
            f'node = "{name}"\nlease_ttl = "{TTL}s"\n'
        )
        self.lines: list[dict[str, object]] = []  # its log, a JSON object a line
        self.proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()

    def start(self) -> None:
        self._ready.clear()
        self.proc = node_process(self.config, self.root, self.socket)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        if not self._ready.wait(120) or self.proc.poll() is not None:
            raise RuntimeError(f"node {self.name} did not start")

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(line, dict):
                self.lines.append(line)
                if line.get("event") == "daemon.ready":
                    self._ready.set()
        self._ready.set()

    def saw(self, event: str, session: str, since: int = 0) -> bool:
        return any(
            line.get("event") == event and line.get("session") == session
            for line in self.lines[since:]
        )

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill9()


def until(check: Any, timeout: float, what: str, step: float = 0.002) -> Any:
    """Poll ``check`` until it is true (its value), or fail after ``timeout``: a
    benchmark polling real nodes (fleet.py too), not a test."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(step)


def node_process(config: Path, root: Path, socket: Path) -> subprocess.Popen[bytes]:
    """A real ``sessiond`` node on ``config``, its log on a pipe (stderr), with none
    of this process's ``SESSIOND_*`` settings (fleet_nodes.py starts its nodes so too)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIOND_")}
    return subprocess.Popen(
        [
            str(BIN / "sessiond"),
            "--config",
            str(config),
            "--state-dir",
            str(root / "state"),
            "--socket",
            str(socket),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )


def _stamp(path: Path) -> float:
    def read() -> float | None:
        try:
            text = path.read_text().strip()
        except OSError:
            return None
        return float(text) if text else None

    return float(until(read, 30, f"{path} to be written"))


def wake(nodes: list[Node], work: Path, samples: int) -> dict[str, list[float]]:
    """Seconds from ``send`` to the probe's first instruction: through another
    node's socket ("cross") and through the owner's own ("local"), in turn."""
    sender, owner = nodes[0], nodes[1]
    ts = work / "ts"
    spec = (
        f'name = "w"\n[run]\nexec = ["bash", "-c", "echo $EPOCHREALTIME > {ts}"]\n'
        f'cwd = "{work}"\nside_effect = "read"\nidempotency = "safe"\n'
        "[limits]\nburst = 10000\n"  # measuring latency, not the rate limit
        '[[trigger]]\ntype = "message"\n'
    )
    call(owner.socket, "create", {"spec": spec, "base": str(work), "source": "w"})
    out: dict[str, list[float]] = {"cross": [], "local": []}
    for i in range(2 * samples):
        via = sender if i % 2 == 0 else owner
        until(
            lambda: call(owner.socket, "show", {"name": "w"})["state"] == "sleeping",
            30,
            "the session to sleep",
        )
        ts.unlink(missing_ok=True)
        sent = time.time()
        call(via.socket, "send", {"to": "w", "text": f"wake {i}", "sender": "bench"})
        out["cross" if via is sender else "local"].append(_stamp(ts) - sent)
    return out


def failover(nodes: list[Node], rounds: int) -> list[float]:
    """Seconds from kill -9 of the session's owner to another node taking it over."""
    owner = nodes[0]
    call(owner.socket, "create", {"spec": 'name = "f"\n', "base": str(owner.root), "source": "f"})
    times = []
    for _ in range(rounds):
        marks = {n.name: len(n.lines) for n in nodes}
        owner.kill9()
        killed = time.monotonic()
        new = until(
            lambda old=owner, marks=marks: next(
                (
                    n
                    for n in nodes
                    if n is not old and n.saw("cluster.taken_over", "f", marks[n.name])
                ),
                None,
            ),
            TTL + 60,
            "a take-over",
        )
        times.append(time.monotonic() - killed)
        owner.start()  # a new incarnation; the session stays where it went
        owner = new
    return times


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(server: LocalPostgres, folder: Path, quick: bool) -> dict[str, object]:
    samples, rounds = (10, 3) if quick else (40, 10)
    server.createdb("nodes")
    dsn = server.dsn_for("nodes")
    from sessiond.log.store.pg import schema

    schema.migrate(dsn)
    nodes = [Node(folder / f"n{i}", dsn, f"n{i}") for i in (1, 2, 3)]
    try:
        for node in nodes:
            node.start()
        work = folder / "wake"
        work.mkdir()
        wakes = wake(nodes, work, samples)
        moves = failover(nodes, rounds)
    finally:
        for node in nodes:
            node.stop()
        for node in nodes:
            shutil.rmtree(node.root, ignore_errors=True)

    def ms(values: list[float], q: float = 0.5) -> float:
        return round((statistics.median(values) if q == 0.5 else pct(values, q)) * 1000, 1)

    return {
        "cross_node_wake_p50_ms": ms(wakes["cross"]),
        "cross_node_wake_p99_ms": ms(wakes["cross"], 0.99),
        "same_node_wake_p50_ms": ms(wakes["local"]),
        "same_node_wake_p99_ms": ms(wakes["local"], 0.99),
        "failover_lease_ttl_s": TTL,
        "failover_rounds": len(moves),
        "failover_p50_s": round(statistics.median(moves), 2),
        "failover_max_s": round(max(moves), 2),
        "failover_each_s": [round(m, 2) for m in moves],
    }
