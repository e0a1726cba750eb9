"""A wake's latency, this tree beside another, in alternation (``python -m
sessiond.bench.wake_ab BASE [SAMPLES]``).

BASE is a folder holding another version's ``sessiond`` package (say ``git
archive REV sessiond | tar -x -C BASE``). Each sample is taken on both trees in
turn, so the machine's load falls on both alike: from the request to the first
instruction of ``bash -c 'echo $EPOCHREALTIME > ts'`` that its wake starts,

- on files, for ``activate`` and for a ``send`` to a message-woken session;
- on a two-node PostgreSQL cluster, for a ``send`` through the owner's socket
  (``pg_local``) and through the other node's (``pg_cross``), as
  ``cluster_nodes.wake`` measures it.

Prints p50 and p99 (ms) of each, with the load average. ``--cluster`` measures
the cluster's two only (``python -m sessiond.bench.wake_ab BASE N --cluster``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sessiond.bench.cluster_nodes import Node, _stamp, pct, until
from sessiond.bench.daemon import BenchDaemon, call
from sessiond.localpg import LocalPostgres, bindir
from sessiond.wire import Params

KINDS = ("files_activate", "files_send", "pg_local", "pg_cross")


def _spec(work: Path) -> str:
    return (
        f'name = "w"\n[run]\nexec = ["bash", "-c", "echo $EPOCHREALTIME > {work / "ts"}"]\n'
        f'cwd = "{work}"\nside_effect = "read"\nidempotency = "safe"\n'
        "[limits]\nburst = 100000\n"  # measuring latency, not the rate limit
        '[[trigger]]\ntype = "message"\n'
    )


def _sample(via: Path, owner: Path, method: str, params: Params, work: Path) -> float:
    """ms from the request through ``via`` to the probe's first instruction."""
    until(lambda: call(owner, "show", {"name": "w"})["state"] == "sleeping", 30, "sleeping")
    ts = work / "ts"
    ts.unlink(missing_ok=True)
    sent = time.time()
    call(via, method, params)
    return (_stamp(ts) - sent) * 1000


def on_files(trees: dict[str, Path], folder: Path, n: int, out: dict[str, list[float]]) -> None:
    daemons: dict[str, BenchDaemon] = {}
    try:
        for tag, source in trees.items():
            root = folder / f"files-{tag}"
            (root / "state").mkdir(parents=True)
            d = daemons[tag] = BenchDaemon(root, source)
            d.start()
            call(d.socket, "create", {"spec": _spec(root), "base": str(root), "source": "w"})
        for i in range(n):
            for tag, d in daemons.items():
                s = d.socket
                out[f"{tag}_files_activate"].append(
                    _sample(s, s, "activate", {"name": "w"}, d.root)
                )
                send = {"to": "w", "text": f"x{i}", "sender": "bench"}
                out[f"{tag}_files_send"].append(_sample(s, s, "send", send, d.root))
    finally:
        for d in daemons.values():
            d.stop()


def on_cluster(trees: dict[str, Path], folder: Path, n: int, out: dict[str, list[float]]) -> None:
    pgdir = Path(tempfile.mkdtemp(prefix="sessiond-bench-pg-"))  # the server's user reads it
    server = LocalPostgres(pgdir, bindir())
    clusters: dict[str, tuple[list[Node], Path]] = {}
    try:
        server.init()
        server.start()
        from sessiond.log.store.pg import schema

        for tag, source in trees.items():
            server.createdb(f"wake_{tag}")
            dsn = server.dsn_for(f"wake_{tag}")
            schema.migrate(dsn)
            os.environ["PYTHONPATH"] = str(source)  # the nodes' code (Node.start copies it)
            nodes = [Node(folder / f"{tag}-n{i}", dsn, f"n{i}") for i in (1, 2)]
            clusters[tag] = (nodes, folder / f"{tag}-work")
            for node in nodes:
                node.start()
            work = clusters[tag][1]
            work.mkdir()
            spec = {"spec": _spec(work), "base": str(work), "source": "w"}
            call(nodes[1].socket, "create", spec)
        order = random.Random(15)
        for i in range(n):
            # Each sample runs in the wake of the one before it (that node's last
            # commits, the other cluster's marks): the order is drawn anew every
            # round, so each kind follows each other kind about as often.
            turn = [(tag, kind) for tag in clusters for kind in ("pg_local", "pg_cross")]
            order.shuffle(turn)
            for tag, kind in turn:
                nodes, work = clusters[tag]
                other, owner = nodes[0].socket, nodes[1].socket
                send = {"to": "w", "text": f"x{i}", "sender": "bench"}
                via = owner if kind == "pg_local" else other
                out[f"{tag}_{kind}"].append(_sample(via, owner, "send", send, work))
    finally:
        os.environ.pop("PYTHONPATH", None)
        for nodes, _ in clusters.values():
            for node in nodes:
                node.stop()
        server.stop()
        shutil.rmtree(pgdir, ignore_errors=True)


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--cluster"]
    cluster_only = len(args) < len(sys.argv) - 1
    if not args:
        print(
            "usage: python -m sessiond.bench.wake_ab BASE_TREE [SAMPLES] [--cluster]",
            file=sys.stderr,
        )
        return 2
    base = Path(args[0]).resolve()
    if not (base / "sessiond" / "__init__.py").exists():
        print(f"{base} holds no sessiond package (git archive REV sessiond | tar -x -C it)")
        return 2
    n = int(args[1]) if len(args) > 1 else 100
    trees = {"base": base, "this": Path(__file__).resolve().parents[2]}
    kinds = KINDS[2:] if cluster_only else KINDS
    out: dict[str, list[float]] = {f"{t}_{k}": [] for t in trees for k in kinds}
    folder = Path(tempfile.mkdtemp(prefix="sessiond-bench-wake-"))
    try:
        if not cluster_only:
            on_files(trees, folder, n, out)
        on_cluster(trees, folder, n, out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    figures: dict[str, object] = {
        k: {"p50": round(statistics.median(v), 1), "p99": round(pct(v, 0.99), 1)}
        for k, v in out.items()
    }
    figures["samples"] = n
    figures["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
