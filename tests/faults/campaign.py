"""The kill -9 campaign: a busy daemon is killed at random moments and at every
named fault point, restarted, and checked, again and again.

    python -m tests.faults.campaign [--iterations 200] [--seed N] [--durability os]

The workload (tests/faults/workload.py) covers the product: an SDK agent on
durable steps of every risk contract whose approvals are answered approve or
deny at random, a command session of every risk contract woken by every, watch,
git, cron and message, a hostile program that approves itself and leaves an
orphan, the supervision issue's other hostile programs (tests/faults/contain.py,
each checked contained), a program that prints its secret, a mailbox sent to all
the time, forked and merged. Each round runs it for a random 0.2 to 2 s and kills the daemon with
SIGKILL (every fourth round instead starts it with the next ``fault`` point, where
it kills itself); every other round then cuts the power; repairs, restarts,
resolves whatever was blocked with ``--accept``, ``--rerun`` or ``--discard`` at
random, and checks what must hold. What ran is judged from the ledger the
workload writes (tests/faults/ledger.py), keyed by what must not repeat, never
from the daemon's own word.

The power cut here is the fallback: each log is cut back to an offset the daemon
reported as fsynced (``record_synced``); artifacts and directory entries are not
rolled back. The table says which method was used.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from sessiond.config import DaemonConfig
from sessiond.log.fsck import check
from sessiond.log.store.base import Record
from sessiond.runs.leftovers import marked
from sessiond.wire import Connection, RemoteError
from tests.e2e.harness import SESSIOND, Daemon, short_dir
from tests.faults import checks, contain, faultfs, ledger, workload
from tests.faults.broken import SPAWNER_DIR
from tests.faults.faultfs import Mount
from tests.faults.tally import Tally
from tests.patience import Patience, log_sizes

# The named fault points of a run (sessiond/runs/start.py, settle.py), read from the
# config's own list so a new point is killed at too; the hand-over's (migrate --to)
# need two daemons and have tests of their own (tests/e2e/test_migrate.py).
FAULT_POINTS = [
    point
    for point in get_args(get_args(DaemonConfig.model_fields["fault"].annotation)[0])
    if not point.startswith(("migrate-", "arrive-"))
]
BASE = 'log_format = "json"\nstop_grace = "2s"\nshutdown_grace = "3s"\n'


def confined(world: Path, sandbox: bool = True) -> str:
    """The campaign's ``[run]`` table (last in the file: a table of its own). Its runs
    are confined as any are (bubblewrap; as root, a uid per session). The ledger is
    the world's record, outside every workspace and outside the daemon: its folder
    is the one more place every run may write. On the fault file system, which
    keeps no ACLs, the workspace is opened to the runs' uids by its mode (0777).
    Without ``sandbox`` (a self-test's break of a layer the sandbox backs up:
    tests/faults/selftest.py) the runs are unconfined."""
    off = "" if sandbox else 'sandbox = "off"\n'
    return f'[run]\n{off}writable = ["{world}"]\n'


class Stop(Exception):
    """The campaign cannot go on (the daemon will not start): the table says why."""


class Campaign:
    # whether a node may answer a send without a seq, left for the owner (a cluster)
    posts_for_owners = False

    def __init__(
        self,
        root: Path,
        rng: random.Random,
        *,
        power_cut: bool = True,
        durability: str = "fsync",
        command: list[str] | None = None,
        mount: Mount | None = None,
        sandbox: bool = True,
    ) -> None:
        self.root = root
        self.sandbox = sandbox
        # On the fault file system the state dir and the workspace are on the mount;
        # the ledger (the world's record) and the sockets are not.
        self.mount = mount
        # (a folder of its own: nothing of the daemons' lies in what a run may write)
        self.ws = (mount.path if mount is not None else root) / "ws"
        self.rng = rng
        self.power_cut = power_cut
        self.durability = durability
        self.synced_file = root / "synced.txt"
        self.world = root / "world"  # the ledger's folder: every run may write in it
        self.ledger = self.world / "ledger"
        self.secret = f"s3cr3t-{rng.getrandbits(64):016x}"
        self.config = (
            f'{BASE}record_synced = "{self.synced_file}"\nmax_running = 6\n'
            f'snapshot_every = 50\ndurability = "{durability}"\nmax_output_bytes = 262144\n'
        )
        self.daemon = Daemon(root, env={"CAMPAIGN_SECRET": self.secret})
        if command is not None:
            self.daemon.command = command
        if mount is not None:
            self.daemon.state_dir = mount.path / "state"
        self.tally = Tally(durability=durability, sandbox=sandbox)
        self.contain = contain.Containment(self.ledger, self.tally)  # the hostile programs
        # (session, seq, text, monotonic time of the answer) of each answered send
        self.acked: list[tuple[str, int | None, str, float]] = []
        # sends a cluster node answered without a seq (left for the mailbox's owner):
        # (session, text, round), each to be delivered (ClusterCampaign._check_posted)
        self.posted: list[tuple[str, str, int]] = []
        self.created: list[str] = []  # forks the daemon acknowledged
        self.sent = 0
        self.lock = threading.Lock()

    # --- set-up --------------------------------------------------------------------

    def setup(self) -> None:
        self.ws.mkdir(exist_ok=True)
        if self.mount is not None:
            self.ws.chmod(0o777)  # no ACLs there: a run's uid writes it by its mode
        workload.prepare(self.ws)
        self.world.mkdir(exist_ok=True)
        self.ledger.touch()
        self._start()
        for name, text in workload.specs(sys.executable, self.ledger, self.daemon.socket).items():
            spec = self.ws / f"{name}.toml"  # a spec's cwd is its folder: the workspace
            spec.write_text(text)
            self.daemon.ctl("create", str(spec), check=True)
        workload.sync_tree(self.ws)

    def _start(self, fault: str | None = None) -> bool:
        """Start the daemon (with ``fault``: it kills itself there); False if it died
        on its way up (a recovery reached the fault point)."""
        extra = f'fault = "{fault}"\n' if fault else ""
        self.daemon.config.write_text(self.config + extra + confined(self.world, self.sandbox))
        if self.mount is not None:
            # The daemon's start-up sync(2), which makes what a dead daemon left in the
            # page cache durable: no sync(2) reaches a FUSE server (libfuse3's API has
            # no syncfs), so the file system is told here, as the kernel would do.
            self.mount.sync()
        try:
            self.daemon.start()
        except AssertionError:
            if fault is None:
                raise
            return False
        return True

    # --- one round -------------------------------------------------------------------

    def round(self) -> None:
        d = self.daemon
        assert d.proc is not None
        n = self.tally.rounds + 1
        fault = FAULT_POINTS[(n // 4) % len(FAULT_POINTS)] if n % 4 == 0 else None
        if fault is not None:  # this round's daemon dies at the fault point by itself
            d.stop()  # a clean shutdown: the next kill is the fault point's
            self.contain.after_stop(d.state_dir)
            if not self._start(fault):
                self.tally.fault_points[fault] += 1
                self._start()
        stop = threading.Event()
        workers = [
            threading.Thread(target=self._sender, args=(stop,), daemon=True),
            threading.Thread(target=self._poker, args=(stop,), daemon=True),
        ]
        pinger = contain.Pinger(d.socket, self.tally).__enter__()
        for w in workers:
            w.start()
        if fault is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                if d.proc.wait(10) == -signal.SIGKILL:
                    self.tally.fault_points[fault] += 1
        else:
            time.sleep(self.rng.uniform(0.2, 2.0))
        if d.proc.poll() is None:
            os.kill(d.proc.pid, signal.SIGKILL)  # no warning, no clean-up: a crash
        d.proc.wait(30)
        killed_at = time.monotonic()
        self.contain.stopping()
        stop.set()
        pinger.__exit__()
        for w in workers:
            w.join(30)
        self.tally.rounds = n
        cut = self.power_cut and n % 2 == 0
        if cut:
            self._power_cut()
        self._repair_and_check_logs()
        self._check_acknowledged(killed_at)
        cut_off = {name: checks.cut_off_calls(self._log(name)) for name in self._names()}
        seqs = {name: self._last_seq(name) for name in self._names()}
        try:
            self._start()
        except AssertionError as exc:  # it will not start on what the cut left
            self.tally.unreadable.append(f"round {n}: the daemon did not start: {exc}"[:300])
            raise Stop from exc
        self._check_after_restart(cut_off, seqs)
        self.contain.orphans(d.proc.pid)  # what carries the marker, not the mark
        self.contain.settled("the restart")
        self._check_ledger()
        secret = self.daemon.state_dir / "sessions" / "secret"  # all of it at the finish
        self.tally.secrets = checks.secret_files(secret, self.secret.encode())
        self._answer_and_resolve()

    # --- the load ------------------------------------------------------------------

    def _sender(self, stop: threading.Event) -> None:
        """Sends to the mailbox back to back; remembers what the daemon answered."""
        try:
            conn = Connection(self.daemon.socket, timeout=10)
        except RemoteError:
            return
        with conn:
            while not stop.is_set():
                self.sent += 1
                text = f"m{self.sent}"
                try:
                    reply = conn.call("send", {"to": "mailbox", "text": text})
                except RemoteError:
                    return  # the daemon died: this one was never acknowledged
                self.acked.append(("mailbox", reply["seq"], text, time.monotonic()))
                time.sleep(0.005)  # appends in flight at the kill, not a huge mailbox

    def _poker(self, stop: threading.Event) -> None:
        """Wakes of every kind, activations, forks and merges, approval answers."""
        try:
            conn = Connection(self.daemon.socket, timeout=10)
        except RemoteError:
            return
        with conn:
            while not stop.wait(self.rng.uniform(0.05, 0.3)):
                try:
                    self._poke(conn)
                except RemoteError as exc:
                    if exc.code in ("unreachable", "closed", "timeout"):
                        return
                    # refused (activate while it runs, a merge of a busy fork): go on
                except (OSError, subprocess.SubprocessError):
                    pass  # the workspace as a power cut left it: the next poke goes on

    def _poke(self, conn: Connection) -> None:
        choice = self.rng.random()
        if choice < 0.3:
            inbox = self.ws / "inbox"  # (a power cut may have taken an unsynced one)
            inbox.mkdir(exist_ok=True)
            (inbox / f"f{self.rng.randrange(20)}").write_text(str(time.time()))
        elif choice < 0.4:
            workload.commit(self.ws / "repo", f"{time.time()}")
        elif choice < 0.5:
            conn.call("send", {"to": "c-confirm", "text": "wake"})
        elif choice < 0.65:
            conn.call("activate", {"name": self.rng.choice(["agent", "c-unsafe", "c-ext"])})
        elif choice < 0.75:
            self._answer_one(conn)
        elif choice < 0.9 and len(self.created) < 30:
            new = f"fork-{len(self.created) + 1}"
            conn.call("fork", {"name": "mailbox", "new": new})
            self.tally.forks += 1
            self.created.append(new)
        elif self.created:
            conn.call("merge", {"child": self.rng.choice(self.created), "summary": "done"})
            self.tally.merges += 1

    def _answer_one(self, conn: Connection) -> None:
        """Approve or deny the agent's pending question, at random."""
        pending = conn.call("show", {"name": "agent"}).get("pending_approvals") or []
        if pending:
            option = self.rng.choice(["approve", "deny"])
            conn.call(option, {"name": "agent", "call": pending[0]["call"], "by": "campaign"})
            self.tally.answered[option] += 1

    # --- the power cut ---------------------------------------------------------------

    def _power_cut(self) -> None:
        """The power goes out: every program stops; on the fault file system all
        that was not fsynced is lost as a disk would lose it; without it (the
        fallback) each log keeps what the daemon reported as fsynced."""
        for pid in marked(self.daemon.state_dir):  # the power stops them all
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in checks.running_from(self.root / SPAWNER_DIR):  # a broken build's
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.contain.power_off()
        if self.mount is not None:
            self._wait_closed()
            self.mount.cut(self.rng.getrandbits(32))
            self.tally.power_cuts += 1
            return
        synced: dict[str, int] = {}
        for line in self.synced_file.read_text().splitlines():
            name, offset = line.rsplit(" ", 1)
            synced[name] = max(synced.get(name, 0), int(offset))
        for name in self._names():
            path = self._log(name)
            size = path.stat().st_size
            if name not in synced or size <= synced[name]:
                continue
            if self.durability == "fsync":
                os.truncate(path, synced[name])
            else:  # written after the last sync (sync_interval): the cache lost any tail
                os.truncate(path, self.rng.randint(synced[name], size))
        self.tally.power_cuts += 1

    def _wait_closed(self, timeout: float = 10.0) -> None:
        """Until no process has a file open on the mount (the killed ones may take
        a moment to go): a cut under an open file would be no power cut."""
        deadline = time.monotonic() + timeout
        assert self.mount is not None
        while checks.holders(self.mount.path) and time.monotonic() < deadline:
            time.sleep(0.05)

    # --- checks ---------------------------------------------------------------------

    def _names(self) -> list[str]:
        folder = self.daemon.state_dir / "sessions"
        try:
            return sorted(n for n in os.listdir(folder) if not n.startswith("."))
        except FileNotFoundError:
            return []  # a power cut took the folder's entry: every session in it is lost

    def _log(self, name: str) -> Path:
        return self.daemon.state_dir / "sessions" / name / "events.jsonl"

    def _last_seq(self, name: str) -> int:
        recs = checks.records(self._log(name))
        return recs[-1]["seq"] if recs else 0

    def _repair_and_check_logs(self) -> None:
        subprocess.run(
            [SESSIOND, "fsck", "--repair", "--state-dir", str(self.daemon.state_dir)],
            capture_output=True,
            check=False,
        )
        for problem in check(self.daemon.state_dir).problems:
            self.tally.unreadable.append(f"round {self.tally.rounds}: {problem}")

    def _check_acknowledged(self, killed_at: float) -> None:
        t = self.tally
        t.acked_sends = len(self.acked)
        received = checks.records(self._log("mailbox"), b"message.received")
        by_seq = {r["seq"]: r for r in received}
        # A cluster node that no longer holds the mailbox (moved by load, taken
        # over) leaves the send in the database for its owner and answers without
        # a seq (sessiond.cluster.mailbox): acknowledged all the same, it must reach
        # the owner's log, by its text (each text is sent once), once the owner
        # delivers it: judged after the take-over (ClusterCampaign.round).
        by_text = {r["data"].get("text"): r for r in received}
        lost = []
        for session, seq, text, when in self.acked:
            record = by_seq.get(seq) if seq is not None else by_text.get(text)
            if record is None and seq is None and self.posts_for_owners:
                if (session, text) not in [(p[0], p[1]) for p in self.posted]:
                    self.posted.append((session, text, t.rounds))
                continue
            if record is None or record["data"].get("text") != text:
                lost.append((when, f"round {t.rounds}: {session} seq {seq} ({text})"))
        if self.durability == "os":
            # what a power cut may lose is the last sync_interval: measure it
            t.lost_os += len(lost)
            if lost:
                t.loss_window = max(t.loss_window, killed_at - min(w for w, _ in lost))
            self.acked = [a for a in self.acked if a[1] in by_seq]  # seqs are reused
        else:
            t.lost += [what for _, what in lost]
        names = set(self._names())
        for new in self.created:
            if new not in names and self.durability == "fsync":
                t.lost_creates.append(f"round {t.rounds}: fork {new}")
        t.acked_creates = len(self.created)
        acked = [line.split()[1] for line in ledger.read(self.ledger) if line.startswith("ack ")]
        finished = set()
        for r in checks.records(self._log("agent")):
            if r["type"] == "tool.intent" and r["data"].get("turn"):
                d = r["data"]
                slot = f"k:{d['key']}" if d.get("key") else str(d["ordinal"])
                finished.add((d["call"], f"agent.t{d['turn']}.{slot}"))
        ok = {r["data"]["call"] for r in checks.records(self._log("agent"), b"tool.finished")
              if r["data"]["status"] == "ok"}  # fmt: skip
        done = {key for call, key in finished if call in ok}
        if self.durability == "fsync":
            for key in acked:
                if key not in done:
                    t.lost.append(f"round {t.rounds}: agent step {key} acknowledged")
        t.acked_steps = len(acked)

    def _check_after_restart(
        self, cut_off: dict[str, dict[str, str]], seqs: dict[str, int]
    ) -> None:
        t, d = self.tally, self.daemon
        assert d.proc is not None
        for pid, mark in checks.orphans(d.state_dir, d.proc.pid).items():
            t.orphans.append(f"round {t.rounds}: pid {pid} ({mark})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # ours (its mark names our state dir)
        with Connection(d.socket, timeout=30) as conn:
            rows = [r for r in conn.call("ps", {}) if self._mine(r)]
            suspects = {
                r["name"]: r["pid"]
                for r in rows
                if r["state"] == "running" and (r["pid"] is None or not _alive(r["pid"]))
            }
            # an exit not read yet is not a stuck session: a hang is
            patience = Patience(d.proc.pid, quiet=10)
            while suspects and patience.waiting():
                patience.pause(0.1)
                now = {r["name"]: r for r in conn.call("ps", {})}
                suspects = {
                    n: p for n, p in suspects.items()
                    if now[n]["state"] == "running" and now[n]["pid"] == p
                }  # fmt: skip
        for name, pid in suspects.items():
            t.stuck.append(f"round {t.rounds}: {name} (pid {pid})")
        for name, calls in cut_off.items():
            if not calls:
                continue
            t.interrupted += len(calls)
            verdict = self._verdict(name, seqs[name])
            outcome, wrong = checks.judge_verdict(calls, verdict)
            t.verdicts[outcome] += len(calls)
            if wrong is not None:
                t.unhandled.append(f"round {t.rounds}: {name}: {wrong}")

    # Hooks for the cluster's campaign (tests/faults/cluster.py), whose logs are in
    # PostgreSQL and whose ps rows may name other nodes' sessions.

    def _verdict(self, name: str, after_seq: int) -> Record | None:
        assert self.daemon.proc is not None
        patience = Patience(self.daemon.proc.pid, progress=self._progress)
        return checks.first_verdict(self._log(name), after_seq, patience)

    def _progress(self) -> int:
        """What grows while the daemon works: its logs."""
        return log_sizes(self.daemon.state_dir / "sessions")

    def _mine(self, row: dict[str, Any]) -> bool:
        """Whether this daemon runs the session of a ps row (all of them here)."""
        return True

    def _check_ledger(self) -> None:
        t = self.tally
        lines = ledger.read(self.ledger)
        judged = ledger.judge(lines)
        t.executions, t.keys = judged.executions, judged.keys
        t.reruns, t.retried = judged.reruns, judged.retried
        if self.durability == "fsync":  # "os": an acknowledged finish may be lost
            t.twice = judged.twice
        t.self_answers = [line for line in lines if line.startswith("selfapproved ")]
        t.outside = sorted({line.split(" ", 1)[1] for line in lines if line.startswith("outside ")})
        t.begun = sorted({ledger.session_of(k) for k in judged.contracts})
        t.idle = [name for name in workload.MUST_WORK if name not in judged.done]
        if not any(line.startswith(workload.COMPACTED) for line in lines):
            t.idle.append("h-compact's compaction command")

    def _answer_and_resolve(self) -> None:
        """Every block is resolved with one of its options at random; the hostile
        program's own question is denied (by the campaign, an operator)."""
        with Connection(self.daemon.socket, timeout=30) as conn:
            with contextlib.suppress(RemoteError):
                shown = conn.call("show", {"name": "hostile"})
                for a in shown.get("pending_approvals") or []:
                    conn.call("deny", {"name": "hostile", "call": a["call"], "by": "campaign"})
            for row in conn.call("ps", {}):
                if self._mine(row) and row.get("boundary") != "sandbox":
                    self.tally.unconfined.append(f"{row['name']}: boundary {row.get('boundary')}")
                if row["state"] != "blocked" or not self._mine(row):
                    continue
                name = row["name"]
                shown = conn.call("show", {"name": name})
                if shown.get("pending_approvals"):
                    continue  # a question, not a block: answered by the poker
                gates = checks.records(self._log(name), b"gate.evaluated")
                options = list(gates[-1]["data"]["options"]) if gates else []
                if not options:
                    continue
                option = self.rng.choice(options)
                # the mark goes first: a rerun may begin before the answer is read
                ledger.append(self.ledger, f"{option} {name}")
                try:
                    conn.call("resolve", {"name": name, "option": option, "by": "campaign"})
                    self.tally.resolved[option] += 1
                except RemoteError:
                    ledger.append(self.ledger, f"un{option} {name}")

    def finish(self) -> None:
        d = self.daemon
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
            self.contain.after_stop(d.state_dir)
            self.contain.quiet()
        t = self.tally
        t.secrets = checks.secret_files(d.state_dir, self.secret.encode())
        wakes: Counter[str] = Counter()
        for name in self._names():
            t.runs += len(checks.records(self._log(name), b"run.started"))
            wakes.update(
                r["data"]["trigger"] for r in checks.records(self._log(name), b"wake.requested")
            )
        t.wakes = dict(wakes)
        self._check_ledger()
        t.finished = True  # from here, a program that never worked is a failure


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_campaign(
    iterations: int,
    seed: int,
    *,
    power_cut: bool = True,
    durability: str = "fsync",
    command: list[str] | None = None,
    progress: bool = False,
    until: Callable[[Tally], bool] | None = None,
    fault_fs: bool = True,
    sandbox: bool = True,
) -> tuple[Tally, float]:
    """``iterations`` rounds (fewer where ``until(tally)`` says enough after one);
    ``command`` starts the daemon instead of ``sessiond`` (a broken build). The
    power cuts are the fault file system's where it can be mounted (``fault_fs``);
    under CI=true the fallback is a failure."""
    started = time.monotonic()
    root = short_dir()
    why_not = faultfs.usable() if fault_fs else "not asked for"
    with contextlib.ExitStack() as stack:
        mount = stack.enter_context(faultfs.mounted(root / "fs")) if why_not is None else None
        tally = _run(root, iterations, seed, power_cut, durability, command, progress, until,
                     mount, sandbox)  # fmt: skip
        if mount is not None and tally.failed and command is None:
            # the evidence outlives the mount: the state dir and workspace as they were
            shutil.copytree(mount.path, root / "fs-kept", symlinks=True, dirs_exist_ok=True)
    if why_not is None:
        tally.power_method = "fault file system (FUSE): what was not fsynced is lost"
    else:
        tally.power_method = (
            f"simulated, no FUSE ({why_not}): logs cut to what the daemon said it fsynced"
        )
        if os.environ.get("CI") == "true" and fault_fs:
            tally.notes.append(
                f"FAILED: under CI=true the fault file system must be used ({why_not})"
            )
            tally.no_fault_fs = True
    if tally.failed and command is None:
        print(f"ledger and state dir (fs-kept/ if on FUSE) kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return tally, time.monotonic() - started


def _run(
    root: Path,
    iterations: int,
    seed: int,
    power_cut: bool,
    durability: str,
    command: list[str] | None,
    progress: bool,
    until: Callable[[Tally], bool] | None,
    mount: Mount | None,
    sandbox: bool = True,
) -> Tally:
    started = time.monotonic()
    campaign = Campaign(
        root, random.Random(seed), power_cut=power_cut, durability=durability, command=command,
        mount=mount, sandbox=sandbox,
    )  # fmt: skip
    try:
        campaign.setup()
        for n in range(1, iterations + 1):
            try:
                campaign.round()
            except Stop:
                break
            if until is not None and until(campaign.tally):
                break
            if progress and n % 20 == 0:
                t = campaign.tally
                print(
                    f"  round {n}/{iterations}, {time.monotonic() - started:.0f} s: "
                    f"{'violations!' if t.failed else 'all invariants hold'}",
                    file=sys.stderr,
                    flush=True,
                )
        campaign.finish()
    finally:
        campaign.daemon.reap()
        # whatever a broken build left running: its spawner, its runs' processes
        left = [*checks.running_from(root / SPAWNER_DIR), *marked(campaign.daemon.state_dir)]
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        campaign.contain.power_off()  # and whatever of the hostile programs is left
    return campaign.tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.campaign", description=__doc__)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--no-power-cut", action="store_true", help="kill -9 only")
    parser.add_argument(
        "--durability",
        choices=["fsync", "os"],
        default="fsync",
        help='the daemon\'s durability; with "os" acknowledged events may be lost '
        "within sync_interval, which is measured",
    )
    args = parser.parse_args(argv)
    print(f"seed {args.seed} (repeat a campaign with --seed)", flush=True)
    tally, seconds = run_campaign(
        args.iterations,
        args.seed,
        power_cut=not args.no_power_cut,
        durability=args.durability,
        progress=True,
    )
    print(tally.table(seconds))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
