"""The fleet benchmark's parts (``python -m sessiond.bench.cluster --fleet``): its
node processes, what it reads of them (RSS, take-overs), and of the database
(placement, connections, cron fires)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import psycopg

from sessiond.bench.cluster_nodes import node_process
from sessiond.bench.daemon import call
from sessiond.codec import decode_line
from sessiond.wire import RemoteError

# The bench's figures and a request's params: JSON as printed or sent, a shape a
# phase (docs/scale.md says each), read back only by the table and the test.
Figures = dict[str, Any]

# A tiny program, run only when asked (no trigger): what 10,000 sleeping sessions
# of a fleet cost, not what their programs do.
TINY = (
    'name = "{name}"\n[run]\nexec = ["true"]\ncwd = "{ws}"\n'
    'side_effect = "read"\nidempotency = "safe"\n'
)
CRON = TINY + '[[trigger]]\ntype = "cron"\nschedule = "* * * * *"\n'


def answers(sock: Path) -> bool:
    """A daemon listens on ``sock``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(sock))
        except OSError:
            return False
    return True


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


class FleetNode:
    """One ``sessiond`` of the fleet. It logs warnings only (JSON): of those, the
    bench keeps when each ``cluster.taken_over`` arrived, and the last few lines
    to name why a node did not start."""

    def __init__(self, root: Path, dsn: str, name: str, ttl: float, shared: Path) -> None:
        self.root = root
        self.name = name
        self.socket = root / "s.sock"
        root.mkdir(parents=True, exist_ok=True)
        self.config = root / "sessiond.toml"
        self.config.write_text(
            f'log_format = "json"\nlog_level = "warning"\n[cluster]\ndsn = "{dsn}"\n'
            f'node = "{name}"\nlease_ttl = "{ttl}s"\nshared_paths = ["{shared}"]\n'
        )
        self.taken: dict[str, float] = {}  # session: monotonic time its take-over was logged
        self.tail: deque[bytes] = deque(maxlen=20)
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        # Started again when it ends by itself (as systemd or `make cluster` would);
        # each such end's exit code is kept: a node whose lease lapsed under load
        # (75) is a figure, not a crash of the bench. Not after kill9.
        self.supervised = False
        self.ended: list[int] = []
        # Held by the sampler between seeing the node ended and starting it again,
        # and by kill9/stop while they stop supervising it: without it a sampler
        # that saw ``supervised`` just before a kill9 counted the kill as an end
        # by itself (-9) and started the killed node again (seen under load).
        self.supervising = threading.Lock()

    def launch(self) -> None:
        self.supervised = True
        self.proc = node_process(self.config, self.root, self.socket)
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while not answers(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = b"".join(self.tail).decode(errors="replace")[-2000:]
                raise RuntimeError(f"node {self.name} did not start: {said}")
            time.sleep(0.05)  # a tool waiting for a process, not a test

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            if b"cluster.taken_over" in raw:
                now = time.monotonic()
                try:
                    session = orjson.loads(raw).get("session")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if isinstance(session, str):
                    self.taken.setdefault(session, now)
            else:
                self.tail.append(raw)
        proc.stderr.close()

    def _reaped(self) -> None:
        """Once its process has ended: its log read to the end, the pipe closed."""
        if self._reader is not None:
            self._reader.join(30)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss(self) -> tuple[int, int]:
        """KiB: the daemon's RSS, and its children's (the spawner) together."""
        if not self.up:
            return 0, 0
        assert self.proc is not None
        return rss_kib(self.proc.pid), sum(rss_kib(c) for c in children(self.proc.pid))

    def revive(self) -> None:
        """Start it again if it ended by itself while supervised (the sampler's)."""
        with self.supervising:
            proc = self.proc
            if self.supervised and proc is not None and proc.poll() is not None:
                self.ended.append(proc.returncode)
                self.launch()

    def kill9(self) -> None:
        with self.supervising:
            self.supervised = False
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)
        self._reaped()

    def stop(self) -> None:
        with self.supervising:
            self.supervised = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._reaped()


def start_all(nodes: list[FleetNode]) -> None:
    """One node after another: ten interpreters starting at once on two shared
    cores can starve a starting node's lease renewal past its deadline."""
    for node in nodes:
        node.launch()
        node.wait_ready()


def calling(node: FleetNode, method: str, params: Figures, ok: str = "") -> Any:
    """``call``, again while ``node`` is being started again (unreachable, exit 3),
    for up to two minutes; an error whose code is ``ok`` counts as done (a
    ``create`` that landed before its node ended)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return call(node.socket, method, params)
        except RemoteError as exc:
            if ok and exc.code == ok:
                return None
            if exc.exit_code != 3 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)  # a tool waiting for a node's restart, not a test


class Db:
    """The bench's own look at the database: one connection, autocommit."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._lock = threading.Lock()
        self._conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)

    def rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._conn.execute(sql, params).fetchall())

    def one(self, sql: str, params: Any = None) -> Any:
        return self.rows(sql, params)[0][0]

    def close(self) -> None:
        self._conn.close()

    def connections(self) -> dict[str, int]:
        """Server connections to this database other than the bench's own, by state."""
        got = self.rows(
            "SELECT coalesce(state, 'none'), count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1"
        )
        out = {str(k): int(v) for k, v in got}
        out["total"] = sum(out.values())
        return out

    def owners(self) -> dict[str, int]:
        return {
            str(o): int(n)
            for o, n in self.rows(
                "SELECT owner, count(*) FROM sessions WHERE owner IS NOT NULL GROUP BY owner"
            )
        }

    def owner_of(self, names: list[str]) -> dict[str, str | None]:
        return dict(self.rows("SELECT name, owner FROM sessions WHERE name = ANY(%s)", (names,)))

    def events(self) -> int:
        return int(self.one("SELECT coalesce(sum(last_seq), 0) FROM sessions"))

    def cron_fires(self, session: str) -> list[str]:
        """The fire time of each cron ``wake.requested`` in ``session``'s log."""
        fires = []
        for (line,) in self.rows(
            "SELECT line FROM events WHERE session = %s ORDER BY seq", (session,)
        ):
            record = decode_line(bytes(line).rstrip(b"\n"))
            if record is None:
                continue
            data = record.get("data") or {}
            if record.get("type") == "wake.requested" and data.get("trigger") == "cron":
                fires.append(str((data.get("details") or {}).get("fire")))
        return fires


class Sampler:
    """Every second, in a thread: the database's connections and each node's RSS;
    the highest seen is kept."""

    def __init__(self, db: Db, nodes: list[FleetNode]) -> None:
        self.db = db
        self.nodes = nodes
        self.max_connections = 0
        self.max_rss: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(psycopg.Error):
                self.max_connections = max(self.max_connections, self.db.connections()["total"])
            for node in self.nodes:
                rss = sum(node.rss())
                self.max_rss[node.name] = max(self.max_rss.get(node.name, 0), rss)
                node.revive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def placement(nodes: list[FleetNode], db: Db) -> Figures:
    """Sessions per live node: from ``nodes`` (``sessionctl nodes --json``), with
    the load figures it has when it has them; from the database where it has not."""
    live = [n for n in nodes if n.up]
    rows: list[Figures] = []
    for node in live:
        try:
            rows = call(node.socket, "nodes", {})
            break
        except Exception:  # a node busy or just killed: ask the next one
            continue
    alive = {str(r["name"]): r for r in rows if r.get("alive")}
    keys = ("sessions", "running", "ready", "max_running", "share")
    if alive and all("sessions" in r for r in alive.values()):
        per = {
            n.name: {k: alive[n.name][k] for k in keys if k in alive.get(n.name, {})} for n in live
        }
        source = "nodes"
    else:
        owners = db.owners()
        per = {n.name: {"sessions": owners.get(n.name, 0)} for n in live}
        source = "database"
    counts = [int(p.get("sessions", 0)) for p in per.values()]
    mean = sum(counts) / len(counts) if counts else 0.0
    return {
        "source": source,
        "per_node": per,
        "max": max(counts, default=0),
        "min": min(counts, default=0),
        "mean": round(mean, 1),
        "skew_max_over_mean": round(max(counts) / mean, 2) if mean else None,
    }


def minute_boundaries(start: datetime, end: datetime) -> int:
    """How many whole minutes begin in (start, end]: a ``* * * * *`` schedule's fires."""
    first = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return 0 if first > end else int((end - first).total_seconds() // 60) + 1


def create_all(nodes: list[FleetNode], names: list[str], ws: Path, clients: int) -> None:
    """Create ``names`` through the nodes in turn, ``clients`` requests at once."""

    def one(i: int) -> None:
        name = names[i]
        spec = TINY.format(name=name, ws=ws)
        call(
            nodes[i % len(nodes)].socket, "create", {"spec": spec, "base": str(ws), "source": name}
        )

    with ThreadPoolExecutor(clients) as pool:
        for _ in pool.map(one, range(len(names))):
            pass
