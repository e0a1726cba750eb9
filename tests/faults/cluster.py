"""The kill -9 campaign against a cluster: two or three nodes on one real
PostgreSQL, a random node killed with SIGKILL each round (most often the one the
load talks to), restarted, and the same invariants checked, plus the cluster's
own: no write under a stale epoch. Every fourth round pauses a whole node
instead (SIGSTOP of its daemon, spawner, holders and programs for 5 x
``lease_ttl``, as a VM pause does), lets the others take its sessions over and
run them, and resumes it, its runs' processes first: no program of the paused
node may write to the ledger outside the database (tests/faults/fenced.py)
once a take-over has started its session elsewhere.

    python -m tests.faults.cluster [--iterations 30] [--seed N] [--nodes 3]

It is the campaign of campaign.py, not a copy: the same workload, load threads,
ledger and checks. What differs is where the logs are (the database: each check
reads a session's log from there) and what a round does (a node dies, the
others take its sessions over within ``lease_ttl``, the node comes back under a
new incarnation). There is no power cut: the logs live in PostgreSQL, whose
durability is its own (``synchronous_commit``), and the fault points are the
single daemon's campaign's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from sessiond.localpg import LocalPostgres, bindir
from sessiond.log.pgfsck import check_db
from sessiond.log.store.base import Record
from sessiond.log.store.pg import schema
from sessiond.log.store.pg.pgstore import PgStore
from sessiond.runs.leftovers import marked
from sessiond.wire import Connection, RemoteError
from tests.e2e.harness import Daemon, short_dir
from tests.faults import checks, workload
from tests.faults.campaign import Campaign, confined
from tests.faults.fenced import NAME as FENCED
from tests.faults.fenced import FencedLedger
from tests.faults.tally import Tally
from tests.freeze import freeze, frozen, programs_of, state, thaw
from tests.patience import SLOW, Patience

# Any node may be the round's victim: each has the short lease, scaled like the
# cluster tests' (tests/cluster/conftest.py) so that a loaded machine's late
# renewal does not end a node the round did not pick.
TTL = 2.0 * SLOW
STALE = ("epoch-decreased", "epoch-ahead")  # pgfsck's kinds for a write past its fence
# sessions owned by no node, or by one whose lease lapsed: not yet taken over
UNOWNED = (
    "SELECT s.name FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner "
    "WHERE s.owner IS NULL OR n.lease_until <= now()"
)


@dataclass
class ClusterTally(Tally):
    nodes: int = 3
    failovers: int = 0  # rounds whose killed node owned sessions, taken over by others
    stale: list[str] = field(default_factory=list)
    freezes: int = 0  # whole-node pauses of 5 x lease_ttl
    refused: int = 0  # attempts the fenced ledger refused (a stale epoch)
    # a paused node's program that wrote to the ledger after its session was taken over
    late_writes: list[str] = field(default_factory=list)
    # pauses that caught no program writing to the ledger: they tested nothing
    idle_pauses: list[str] = field(default_factory=list)
    # acknowledged sends a node left for the mailbox's owner (answered without a seq)
    posted: int = 0

    def rows(self) -> list[tuple[str, str, str, bool]]:
        return [
            *super().rows(),
            ("writes under a stale epoch", str(len(self.stale)), "0", not self.stale),
            ("ledger writes by a paused node after take-over", str(len(self.late_writes)), "0",
             not self.late_writes),
            ("pauses that caught no program writing", str(len(self.idle_pauses)), "0",
             not self.idle_pauses),
        ]  # fmt: skip

    def table(self, seconds: float) -> str:
        text = super().table(seconds)
        text = text.replace(
            "kill -9 campaign,", f"kill -9 campaign on a cluster of {self.nodes} nodes,", 1
        )
        moved = f"failovers: {self.failovers} of {self.rounds} kills moved sessions to another node"
        text = text.replace("\nkills at fault points: none", f"\n{moved}", 1)
        frozen = (
            f"whole-node pauses: {self.freezes} (5 x lease_ttl each); the fenced ledger "
            f"refused {self.refused} attempts under a stale epoch"
        )
        text = text.replace(f"\n{moved}", f"\n{moved}\n{frozen}", 1)
        text += f"\nsends left for the mailbox's owner (judged in its log): {self.posted}"
        extra = [f"  stale epoch: {item}" for item in self.stale[:10]]
        extra += [f"  written after take-over: {item}" for item in self.late_writes[:10]]
        extra += [f"  paused with no program writing: {item}" for item in self.idle_pauses[:10]]
        return "\n".join([text, *extra])


class ClusterCampaign(Campaign):
    posts_for_owners = True

    def __init__(self, root: Path, rng: random.Random, dsn: str, *, nodes: int = 3) -> None:
        super().__init__(root, rng, power_cut=False)
        self.dsn = dsn
        self.cluster_tally = ClusterTally(nodes=nodes)
        self.tally = self.cluster_tally  # the base campaign counts in it too
        self.tally.power_method = "none: the logs are in PostgreSQL; nodes are killed"
        for i in range(1, nodes + 1):
            (root / f"n{i}").mkdir()
        self.nodes = [
            Daemon(root / f"n{i}", env={"CAMPAIGN_SECRET": self.secret})
            for i in range(1, nodes + 1)
        ]
        for i, node in enumerate(self.nodes, 1):
            node.config.write_text(
                f'log_format = "json"\nstop_grace = "2s"\nshutdown_grace = "3s"\n'
                f"max_running = 6\nsnapshot_every = 50\n"
                f'[cluster]\ndsn = "{dsn}"\nnode = "n{i}"\nlease_ttl = "{TTL}s"\n'
                # the nodes share this machine: every workspace may fail over
                f'shared_paths = ["{root}"]\n' + confined(self.world)
            )
        self.daemon = self.nodes[0]  # the node the load talks to (the mailbox's owner)
        self.reader = PgStore(dsn, node="campaign")  # reads only: it holds no lease
        self.fenced = FencedLedger(root)  # the ledger outside the database
        self.logs = root / "pglogs"
        self.logs.mkdir()

    # --- where the logs are ---------------------------------------------------------

    def _names(self) -> list[str]:
        return self.reader.names()

    def _log(self, name: str) -> Path:
        """The session's log as read from the database now, as a file the checks
        read (one per call: the checks see it as it is at that moment)."""
        path = self.logs / f"{name}.jsonl"
        with path.open("wb") as f:
            for _record, line in self.reader.read_lines(name):
                f.write(line)
        return path

    def _verdict(self, name: str, after_seq: int) -> Record | None:
        # the take-over (a lease's lapse), then the gate
        patience = Patience(self._live(), quiet=TTL + 60)
        while True:
            for r in checks.records(self._log(name), b"gate.evaluated"):
                if r["seq"] > after_seq and not r["data"].get("dry_run"):
                    return r
            if not patience.waiting():
                return None
            patience.pause(0.1)

    def _live(self) -> list[int]:
        """The nodes' daemons: the judges wait while they could run (patience.py)."""
        return [n.proc.pid for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def _mine(self, row: dict[str, Any]) -> bool:
        # A row no node answers for (waiting, unknown, unowned: a session between
        # two nodes, handed over for load or being taken over) is nobody's run now,
        # and has no boundary to judge: its owner's own row is judged once it has it.
        placeholder = row.get("state") in ("waiting", "unknown", "unowned")
        return row.get("node") in (None, self._name(self.daemon)) and not placeholder

    # --- set-up and one round -------------------------------------------------------

    def setup(self) -> None:
        self.ws.mkdir()
        workload.prepare(self.ws)
        self.world.mkdir()
        self.ledger.touch()
        self.fenced.start()
        for node in self.nodes:
            node.start()
        for name, text in workload.specs(sys.executable, self.ledger, self.daemon.socket).items():
            spec = self.ws / f"{name}.toml"
            spec.write_text(text)
            self.daemon.ctl("create", str(spec), check=True)
        self.daemon.ctl("create", str(self.fenced.spec(self.ws, sys.executable)), check=True)

    def round(self) -> None:
        t = self.tally
        n = t.rounds + 1
        self.daemon = self._owner_of("mailbox")
        # Odd rounds kill the mailbox's owner and wait for the others to take its
        # sessions over, so every run (even the 4 rounds of `make test`) has a
        # failover; even rounds kill any node and restart it at once or later;
        # every fourth pauses the node that runs `fenced` instead, past its lease.
        paused = n % 4 == 0
        takeover = n % 2 == 1 or paused
        victim = self.daemon if takeover or self.rng.random() < 0.6 else self.rng.choice(self.nodes)
        if paused:
            victim = self._owner_of(FENCED)
        stop = threading.Event()
        workers = [
            threading.Thread(target=self._sender, args=(stop,), daemon=True),
            threading.Thread(target=self._poker, args=(stop,), daemon=True),
        ]
        for w in workers:
            w.start()
        time.sleep(self.rng.uniform(0.2, 2.0))
        assert victim.proc is not None
        if paused:  # the load stops first: its calls would wait on the paused node
            stop.set()
            for w in workers:
                w.join(30)
            pids, programs = self._pause(victim)
        else:
            os.kill(victim.proc.pid, signal.SIGKILL)  # no warning, no clean-up: a crash
            victim.proc.wait(30)
        killed_at = time.monotonic()
        stop.set()
        for w in workers:
            w.join(30)
        t.rounds = n
        owned = self._owned_by(self._name(victim))
        self._check_acknowledged(killed_at)
        cut_off = {name: checks.cut_off_calls(self._log(name)) for name in owned}
        seqs = {name: self._last_seq(name) for name in owned}
        if paused:
            self._resume_after_take_over(victim, pids, programs, killed_at)
        if takeover or self.rng.random() < 0.5:  # once the others took its sessions over
            self._settle(victim)
        victim.start()
        self._settle(None)
        if owned and any(self._owner(name) != self._name(victim) for name in owned):
            self.cluster_tally.failovers += 1
        self._check_posted()
        for i, node in enumerate(self.nodes):
            self.daemon = node
            self._check_after_restart(cut_off if i == 0 else {}, seqs)
        self._check_ledger()
        self._check_database()
        self._check_fenced()
        for node in self.nodes:
            self.daemon = node
            self._answer_and_resolve()

    def _check_posted(self) -> None:
        """The sends a node answered without a seq (left in the database for the
        mailbox's owner: sessiond.cluster.mailbox) are in the owner's log once it
        delivered them; each one missing when the nodes have settled is lost."""
        if not self.posted:
            return
        patience = Patience(self._live(), quiet=TTL + 60)
        while True:
            received = checks.records(self._log("mailbox"), b"message.received")
            by_text = {r["data"].get("text"): r["seq"] for r in received}
            if all(text in by_text for _, text, _ in self.posted) or not patience.waiting():
                break
            patience.pause(0.1)
        self.cluster_tally.posted += len(self.posted)
        for session, text, n in self.posted:
            if text not in by_text:
                self.tally.lost.append(f"round {n}: {session} {text}, posted for its owner")
        # delivered: judged by seq from now on, as the others
        self.acked = [
            (s, by_text.get(text), text, w) if seq is None else (s, seq, text, w)
            for s, seq, text, w in self.acked
        ]
        self.posted = []

    # --- a whole node paused --------------------------------------------------------

    def _pause(self, victim: Daemon) -> tuple[list[int], list[int]]:
        """SIGSTOP the node's whole tree once its `fenced` program is writing; the
        pids stopped, and those of its runs' own processes."""
        assert victim.proc is not None
        name, since = self._name(victim), time.monotonic()
        patience = Patience(self._live(), quiet=TTL + 60)
        while not self.fenced.tried_since(name, since) and patience.waiting():
            patience.pause(0.05)
        pids = freeze(victim.proc.pid)
        if not self.fenced.tried_since(name, since):
            self.cluster_tally.idle_pauses.append(f"round {self.tally.rounds + 1}: {name}")
        patience = Patience(self._live(), quiet=TTL + 60)
        while not frozen(pids) and patience.waiting():
            patience.pause(0.01)
        self.cluster_tally.freezes += 1
        return pids, programs_of(victim.proc.pid)

    def _resume_after_take_over(
        self, victim: Daemon, pids: list[int], programs: list[int], paused_at: float
    ) -> None:
        """Once the others took its sessions over (and 5 x lease_ttl passed), SIGCONT
        the node, its runs' processes first and alone: the worst order. The ledger
        then must have nothing of it from the resume on: a take-over had started its
        session elsewhere before."""
        name, resumed = self._name(victim), paused_at
        try:
            self._settle(victim)
            time.sleep(max(0.0, paused_at + 5 * TTL - time.monotonic()))
            resumed = time.monotonic()
            thaw(programs)
            patience = Patience(self._live(), quiet=TTL + 60)
            while patience.waiting() and not (
                all(state(p) in ("Z", "") for p in programs)
                or self.fenced.tried_since(name, resumed)
            ):
                patience.pause(0.01)
        finally:
            thaw(pids)
        assert victim.proc is not None
        victim.proc.wait(60)  # it found its lease lost and ended (exit 75)
        self._judge_resume(name, resumed)

    def _judge_resume(self, name: str, resumed: float) -> None:
        """Whatever the paused node ``name``'s programs tried from ``resumed`` on."""
        for e in self.fenced.tried_since(name, resumed):
            self.cluster_tally.late_writes.append(
                f"round {self.tally.rounds}: {name}'s run of {e.session} under epoch "
                f"{e.epoch}, {e.at - resumed:.3f} s after the resume "
                f"({'accepted' if e.ok else 'refused'})"
            )

    # --- the cluster's own checks ---------------------------------------------------

    def _check_fenced(self) -> None:
        """The ledger outside the database: its fence refused what it should, and it
        never accepted an epoch below one it had accepted."""
        t = self.cluster_tally
        t.refused = sum(1 for e in self.fenced.entries() if not e.ok)
        for e in self.fenced.stale_accepted():
            t.stale.append(f"the fenced ledger accepted {e.session} epoch {e.epoch} from {e.node}")

    def _check_database(self) -> None:
        """The database's fsck: a stale epoch is a write past the fence; any other
        problem is a log unreadable."""
        for problem in check_db(self.dsn).problems:
            t = self.cluster_tally
            where = t.stale if problem.kind in STALE else t.unreadable
            where.append(f"round {self.tally.rounds}: {problem.line()}")

    def _settle(self, dead: Daemon | None) -> None:
        """Until no session waits for a node whose lease lapsed (with ``dead``, that
        node's lease has lapsed and the others took its sessions over)."""
        patience = Patience(self._live(), quiet=TTL + 60)
        waiting: list[Any] = []
        while patience.waiting():
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                waiting = conn.execute(UNOWNED).fetchall()
                lapsed = dead is None or bool(
                    conn.execute(
                        "SELECT 1 FROM nodes WHERE name = %s AND lease_until <= now()",
                        (self._name(dead),),
                    ).fetchall()
                )
            if lapsed and not waiting:
                return
            patience.pause(0.1)
        self.tally.stuck.append(f"round {self.tally.rounds}: not taken over: {waiting}")

    def _owner(self, name: str) -> str | None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT owner FROM sessions WHERE name = %s", (name,)).fetchone()
        return None if row is None else row[0]

    def _owned_by(self, node: str) -> list[str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT name FROM sessions WHERE owner = %s", (node,)).fetchall()
        return sorted(r[0] for r in rows)

    def _owner_of(self, session: str) -> Daemon:
        """The live node that runs ``session`` (its ps lists it)."""
        patience = Patience(self._live(), quiet=TTL + 60)
        while patience.waiting():
            owner = self._owner(session)
            for node in self.nodes:
                if self._name(node) == owner and node.proc and node.proc.poll() is None:
                    with contextlib.suppress(RemoteError), Connection(node.socket) as conn:
                        rows = conn.call("ps", {})
                        if any(r["name"] == session and self._local(node, r) for r in rows):
                            return node
            patience.pause(0.1)
        raise AssertionError(f"no live node runs {session!r}")

    def _name(self, node: Daemon) -> str:
        return f"n{self.nodes.index(node) + 1}"

    def _local(self, node: Daemon, row: dict[str, Any]) -> bool:
        return row.get("node") in (None, self._name(node))

    def finish(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.stop()
        self.daemon = self.nodes[0]
        super().finish()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            found = conn.execute(
                "SELECT session, seq FROM events WHERE position(%(s)s IN line) > 0 UNION ALL "
                "SELECT sa.session, 0 FROM session_artifacts AS sa JOIN artifacts AS a "
                "USING (digest) WHERE position(%(s)s IN a.data) > 0",
                {"s": self.secret.encode()},
            ).fetchall()
        self.tally.secrets += [f"the database: {s} seq {q}" for s, q in found]

    def close(self) -> None:
        self.fenced.close()
        for node in self.nodes:
            node.reap()
        for node in self.nodes:  # whatever a node's runs left
            for pid in marked(node.state_dir):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self.reader.close_sync()


def run_cluster_campaign(
    iterations: int, seed: int, dsn: str, *, nodes: int = 3
) -> tuple[ClusterTally, float]:
    """``iterations`` rounds against ``nodes`` nodes on the (migrated, empty) database
    at ``dsn``."""
    started = time.monotonic()
    root = short_dir()
    campaign = ClusterCampaign(root, random.Random(seed), dsn, nodes=nodes)
    try:
        campaign.setup()
        for _ in range(iterations):
            campaign.round()
        campaign.finish()
    finally:
        campaign.close()
    tally = campaign.cluster_tally
    if tally.failed:
        print(f"ledger and node folders kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return tally, time.monotonic() - started


@contextlib.contextmanager
def database() -> Iterator[str]:
    """A PostgreSQL of its own from the machine's binaries, migrated (the make target's)."""
    folder = Path(tempfile.mkdtemp(prefix="sessiond-pg-"))
    server = LocalPostgres(folder, bindir())
    try:
        server.init()
        server.start()
        schema.migrate(server.dsn)
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.cluster", description=__doc__)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--nodes", type=int, choices=[2, 3], default=3)
    args = parser.parse_args(argv)
    print(f"seed {args.seed} (repeat a campaign with --seed)", flush=True)
    with database() as dsn:
        tally, seconds = run_cluster_campaign(args.iterations, args.seed, dsn, nodes=args.nodes)
    print(tally.table(seconds))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
