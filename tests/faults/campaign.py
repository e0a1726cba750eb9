"""The kill -9 campaign: a busy daemon is killed at random moments, restarted, and
checked, again and again.

    python -m tests.faults.campaign [--iterations 200] [--seed N] [--power-cut]

The workload: an SDK agent whose unsafe tool blocks append to a ledger (with safe
and conditional/rerun-after-check blocks between), a command session with the
unsafe/require-user-confirmation contract that does the same, a command session
woken by file changes (safe, replay-from-event), a cron session (unsafe,
never-rerun, also with a ledger), a mailbox that clients
`send` to all the time, forks of it, and messages the agent sends. Each round
runs it for a random 0.2 to 2 s, kills the daemon with SIGKILL (its programs are
orphaned, as in a real crash), optionally simulates a power cut (every log cut
back to the last offset the daemon had fsynced), repairs, restarts, resolves
whatever the gate blocked with ``--accept`` (keep what was done, never repeat
it), and checks:

- acknowledged events lost: every ``send`` the daemon answered is in the log at
  the seq it answered with, and every tool block the agent saw finish is there;
- logs unreadable after repair: ``sessiond fsck`` finds nothing wrong;
- unsafe tool blocks run twice: no tool call id (and no step of the agent) is in
  a ledger twice;
- sessions stuck in `running` with no program: none, once the daemon serves;
- interrupted runs: each run the kill cut off is either resumed by its policy or
  blocked with a reason, after the restart.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessiond.codec import decode_line
from sessiond.log.fsck import check
from sessiond.runs.runner import proc_start_time
from sessiond.wire import Connection, RemoteError
from tests.e2e.harness import SESSIOND, Daemon, alive, short_dir

AGENT = '''\
"""The campaign's agent: each turn does the next steps of its task, as far as the
log says it got (the log is the truth; the workspace may hold a half-done step).
A later run of the same turn gets its finished steps replayed, never redone."""
from pathlib import Path

from sessiond.sdk import connect


def write(step):
    with open("ledger.agent", "a") as f:  # the step's stable key: one line per execution
        f.write(f"{step} {run.key()}\\n")
    Path("agent.out").write_text(f"step {step}\\n")
    return run.key()


def note(step):
    with open("notes.out", "a") as f:
        f.write(f"step {step}\\n")


with connect() as run:
    ctx = run.context()
    done = sum(1 for m in ctx["messages"]
               if m["kind"] == "observation" and m.get("tool") == "write")
    for step in range(done + 1, done + 3):
        run.step("read", lambda: None, args={"step": step}, side_effect="read",
                 idempotency="safe", resume="replay-from-event")
        key = run.step("write", lambda: write(step), args={"step": step}, writes=["agent.out"],
                       side_effect="workspace-write", idempotency="unsafe",
                       resume="require-user-confirmation")
        if key is not None:  # None: a person accepted a cut-off write (no result)
            with open("acked.agent", "a") as f:  # the daemon acknowledged the finish
                f.write(f"{key}\\n")
        run.step("note", lambda: note(step), args={"step": step}, writes=["notes.out"],
                 side_effect="workspace-write", idempotency="conditional",
                 resume="rerun-after-check")
    run.send("mailbox", f"agent reached step {step}")
    run.sleep()
'''

SPECS = {
    "agent": """name = "agent"
[run]
kind = "sdk"
exec = ["{python}", "agent.py"]
cwd = "."
retries = 0
[[trigger]]
type = "every"
interval = "1s"
""",
    "unsafe": """name = "unsafe"
[run]
exec = ["sh", "-c", "echo \\"$SESSIOND_CALL\\" >> ledger.unsafe; sleep 0.2; date > unsafe.out"]
cwd = "."
writes = ["unsafe.out"]
idempotency = "unsafe"
resume = "require-user-confirmation"
retries = 0
[[trigger]]
type = "every"
interval = "1s"
""",
    "watcher": """name = "watcher"
[run]
exec = ["sh", "-c", "ls inbox | wc -l > watcher.out"]
cwd = "."
idempotency = "safe"
resume = "replay-from-event"
retries = 0
[[trigger]]
type = "watch"
paths = ["inbox"]
debounce = "50ms"
""",
    "cron": """name = "cron"
[run]
exec = ["sh", "-c", "echo \\"$SESSIOND_CALL\\" >> ledger.cron; date >> cron.out"]
cwd = "."
writes = ["cron.out"]
idempotency = "unsafe"
resume = "never-rerun"
[[trigger]]
type = "cron"
schedule = "* * * * *"
""",
    "mailbox": 'name = "mailbox"\n',
}

INVARIANTS = [
    ("acknowledged events lost", "0"),
    ("logs unreadable after repair", "0"),
    ("unsafe tool blocks run twice", "0"),
    ("sessions stuck in running with no program", "0"),
    ("interrupted runs resumed or blocked with a reason", "all"),
]


@dataclass
class Tally:
    durability: str = "fsync"
    rounds: int = 0
    power_cuts: int = 0
    acked_sends: int = 0
    acked_tools: int = 0
    lost: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    interrupted: int = 0
    handled: int = 0
    unhandled: list[str] = field(default_factory=list)
    resolved: int = 0
    forks: int = 0
    runs: int = 0
    wakes: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.unreadable or self.twice or self.stuck or self.unhandled)

    def rows(self) -> list[tuple[str, str, str, bool]]:
        # With durability "os" an acknowledged event may die with the power (that is
        # the trade the setting makes), so only readability and consistency hold.
        fsync = self.durability == "fsync"
        return [
            (
                "acknowledged events lost",
                str(len(self.lost)) if fsync else "n/a (os)",
                "0",
                not self.lost,
            ),
            ("logs unreadable after repair", str(len(self.unreadable)), "0", not self.unreadable),
            (
                "unsafe tool blocks run twice",
                str(len(self.twice)) if fsync else "n/a (os)",
                "0",
                not self.twice,
            ),
            (
                "sessions stuck in running with no program",
                str(len(self.stuck)),
                "0",
                not self.stuck,
            ),
            (
                "interrupted runs resumed or blocked with a reason",
                f"{self.handled} of {self.interrupted}",
                "all",
                not self.unhandled,
            ),
        ]

    def table(self, seconds: float) -> str:
        lines = [
            f"kill -9 campaign, durability {self.durability}: {self.rounds} rounds "
            f"({self.power_cuts} with a power cut) "
            f"in {seconds:.0f} s; {self.acked_sends} acknowledged sends, {self.acked_tools} "
            f"acknowledged tool blocks, {self.runs} runs, {self.forks} forks, "
            f"{self.resolved} blocks resolved with --accept",
            "wakes by trigger: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.wakes.items(), key=lambda kv: -kv[1])),
            "",
            f"{'invariant':<52} {'measured':>12} {'must be':>8}  ok",
        ]
        for name, value, want, ok in self.rows():
            lines.append(f"{name:<52} {value:>12} {want:>8}  {'yes' if ok else 'NO'}")
        for label, items in (
            ("lost", self.lost),
            ("unreadable", self.unreadable),
            ("run twice", self.twice),
            ("stuck", self.stuck),
            ("unhandled", self.unhandled),
        ):
            for item in items[:10]:
                lines.append(f"  {label}: {item}")
        return "\n".join(lines)


class Campaign:
    def __init__(
        self, root: Path, rng: random.Random, *, power_cut: bool, durability: str = "fsync"
    ) -> None:
        self.root = root
        self.rng = rng
        self.power_cut = power_cut
        self.durability = durability
        self.synced_file = root / "synced.txt"
        self.daemon = Daemon(
            root,
            f'record_synced = "{self.synced_file}"\nmax_running = 4\nsnapshot_every = 50\n'
            f'durability = "{durability}"\n',
        )
        self.tally = Tally(durability=durability)
        self.acked: list[tuple[str, int, str]] = []  # (session, seq, text) of answered sends
        self.sent = 0
        self.forks = 0

    # --- set-up --------------------------------------------------------------------

    def setup(self) -> None:
        (self.root / "agent.py").write_text(AGENT)
        (self.root / "inbox").mkdir()
        self.daemon.start()
        for name, text in SPECS.items():
            spec = self.daemon.write_spec(name, text.format(python=sys.executable))
            self.daemon.ctl("create", str(spec), check=True)

    # --- one round -------------------------------------------------------------------

    def round(self) -> None:
        d = self.daemon
        stop = threading.Event()
        workers = [
            threading.Thread(target=self._sender, args=(stop,), daemon=True),
            threading.Thread(target=self._poker, args=(stop,), daemon=True),
        ]
        for w in workers:
            w.start()
        time.sleep(self.rng.uniform(0.2, 2.0))
        assert d.proc is not None
        os.kill(d.proc.pid, signal.SIGKILL)  # no warning, no clean-up: a crash
        d.proc.wait(30)
        stop.set()
        for w in workers:
            w.join(30)
        self.tally.rounds += 1
        self.tally.acked_sends = len(self.acked)
        cut = self.power_cut and self.tally.rounds % 2 == 0
        if cut:
            self._kill_orphans()
            self._cut_to_synced()
            self.tally.power_cuts += 1
        self._repair_and_check_logs()
        if self.durability == "fsync":
            self._check_acknowledged()
        running_at_kill = self._running_in_logs()
        sizes = {name: self._log(name).stat().st_size for name in self._names()}
        d.start()
        self._check_after_restart(running_at_kill, sizes)
        if self.durability == "fsync":
            self._check_ledgers()
        self._resolve_blocked()

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
                self.acked.append(("mailbox", reply["seq"], text))
                # Paced a little: the point is appends in flight at the kill, not a
                # mailbox of a million events to re-read after every round.
                time.sleep(0.005)

    def _poker(self, stop: threading.Event) -> None:
        """Wakes: files into the watched folder, activations, a fork now and then."""
        try:
            conn = Connection(self.daemon.socket, timeout=10)
        except RemoteError:
            return
        with conn:
            while not stop.wait(self.rng.uniform(0.05, 0.3)):
                choice = self.rng.random()
                try:
                    if choice < 0.5:
                        (self.root / "inbox" / f"f{self.rng.randrange(20)}").write_text(
                            str(time.time())
                        )
                    elif choice < 0.8:
                        conn.call("activate", {"name": self.rng.choice(["agent", "unsafe"])})
                    elif self.forks < 30:
                        self.forks += 1
                        conn.call("fork", {"name": "mailbox", "new": f"fork-{self.forks}"})
                        self.tally.forks += 1
                except RemoteError as exc:
                    if exc.code in ("unreachable", "closed", "timeout"):
                        return
                    # refused (e.g. activate while it runs, or blocked): the load goes on

    # --- checks ---------------------------------------------------------------------

    def _names(self) -> list[str]:
        folder = self.daemon.state_dir / "sessions"
        return sorted(n for n in os.listdir(folder) if not n.startswith("."))

    def _log(self, name: str) -> Path:
        return self.daemon.state_dir / "sessions" / name / "events.jsonl"

    def _records(self, name: str, only: bytes = b"") -> list[dict[str, Any]]:
        """The complete lines of a log (the daemon may be writing the next one); with
        ``only``, just the events of that type (the mailbox grows by thousands a round)."""
        data = self._log(name).read_bytes()
        out = []
        needle = b'"type":"' + only + b'"'
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            if only and needle not in line:
                continue
            record = decode_line(line)
            if record is None:
                raise AssertionError(f"{name}: a complete line fails its checksum: {line[:200]!r}")
            out.append(record)
        return out

    def _kill_orphans(self) -> None:
        """A power cut stops the programs too, wherever they are. Only the programs
        this campaign's daemon started (pid and start time from its log) are hit."""
        for name in self._names():
            for r in self._records(name, b"run.started"):
                pid, pgid = r["data"]["pid"], r["data"]["pgid"]
                if alive(pid) and proc_start_time(pid) == r["data"]["proc_start"]:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)

    def _cut_to_synced(self) -> None:
        """The power cut: each log keeps only what the daemon knew was on disk."""
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

    def _repair_and_check_logs(self) -> None:
        subprocess.run(
            [SESSIOND, "fsck", "--repair", "--state-dir", str(self.daemon.state_dir)],
            capture_output=True,
            check=False,
        )
        report = check(self.daemon.state_dir)
        for problem in report.problems:
            self.tally.unreadable.append(f"round {self.tally.rounds}: {problem}")

    def _check_acknowledged(self) -> None:
        by_seq = {r["seq"]: r for r in self._records("mailbox")}
        for session, seq, text in self.acked:
            record = by_seq.get(seq)
            if record is None or record["data"].get("text") != text:
                self.tally.lost.append(f"round {self.tally.rounds}: {session} seq {seq} ({text})")
        acked_file = self.root / "acked.agent"
        calls = acked_file.read_text().split() if acked_file.exists() else []
        # acked.agent names each write by its step key (session.tTURN.SLOT): the
        # step's tool.intent says which call that was
        intents = {r["data"]["call"]: r["data"] for r in self._records("agent", b"tool.intent")}
        finished = set()
        for r in self._records("agent", b"tool.finished"):
            intent = intents.get(r["data"]["call"])
            if intent is not None and intent.get("turn") and r["data"]["status"] == "ok":
                slot = f"k:{intent['key']}" if intent.get("key") else str(intent["ordinal"])
                finished.add(f"agent.t{intent['turn']}.{slot}")
        for call in calls:
            if call not in finished:
                self.tally.lost.append(f"round {self.tally.rounds}: agent tool.finished {call}")
        self.tally.acked_tools = len(calls)

    def _running_in_logs(self) -> dict[str, int]:
        """Sessions whose log says `running` at the kill, with the log's last seq."""
        out = {}
        for name in self._names():
            changes = self._records(name, b"lifecycle.changed")
            if changes and changes[-1]["data"]["to"] == "running":
                out[name] = changes[-1]["seq"]
        return out

    def _check_after_restart(self, running_at_kill: dict[str, int], sizes: dict[str, int]) -> None:
        d = self.daemon
        with Connection(d.socket, timeout=30) as conn:
            # A program that has just exited is `running` until the daemon has read its
            # exit: only a session still so after 5 s, with the same pid, is stuck.
            suspects = {
                row["name"]: row["pid"]
                for row in conn.call("ps", {})
                if row["state"] == "running" and (row["pid"] is None or not alive(row["pid"]))
            }
            deadline = time.monotonic() + 5
            while suspects and time.monotonic() < deadline:
                time.sleep(0.1)
                rows = {row["name"]: row for row in conn.call("ps", {})}
                suspects = {
                    name: pid
                    for name, pid in suspects.items()
                    if rows[name]["state"] == "running" and rows[name]["pid"] == pid
                }
            for name, pid in suspects.items():
                self.tally.stuck.append(f"round {self.tally.rounds}: {name} (pid {pid})")
        for name, seq in running_at_kill.items():
            self.tally.interrupted += 1
            verdict = self._await_verdict(name, seq)
            if verdict is None:
                self.tally.unhandled.append(
                    f"round {self.tally.rounds}: {name} (no gate verdict or rebuilt result)"
                )
            else:
                self.tally.handled += 1

    def _await_verdict(self, name: str, seq: int, timeout: float = 20.0) -> str | None:
        """How the restart dealt with a cut-off run: 'resumed' (the gate let it go on, or
        its finished result was rebuilt) or 'blocked' (with a reason)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            after = [r for r in self._records(name) if r["seq"] > seq]
            for r in after:
                if r["type"] == "observation.projected" and r["data"]["source"] == "rebuilt":
                    return "resumed"
                if r["type"] == "gate.evaluated" and r["data"]["ok"]:
                    return "resumed"
                if (
                    r["type"] == "lifecycle.changed"
                    and r["data"]["to"] == "blocked"
                    and r["data"]["reason"]
                ):
                    return "blocked"
            time.sleep(0.05)
        return None

    def _check_ledgers(self) -> None:
        for ledger, key in (("ledger.agent", 1), ("ledger.unsafe", 0), ("ledger.cron", 0)):
            path = self.root / ledger
            if not path.exists():
                continue
            lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
            calls = Counter(parts[key] for parts in lines if len(parts) > key)
            for call, n in calls.items():
                if n > 1:
                    self.tally.twice.append(f"{ledger}: call {call} ran {n} times")
            if ledger == "ledger.agent":
                steps = Counter(parts[0] for parts in lines)
                for step, n in steps.items():
                    if n > 1:
                        self.tally.twice.append(f"{ledger}: step {step} ran {n} times")
        self.tally.twice = sorted(set(self.tally.twice))

    def _resolve_blocked(self) -> None:
        with Connection(self.daemon.socket, timeout=30) as conn:
            for row in conn.call("ps", {}):
                if row["state"] == "blocked":
                    try:
                        conn.call(
                            "resolve", {"name": row["name"], "option": "accept", "by": "campaign"}
                        )
                        self.tally.resolved += 1
                    except RemoteError:
                        pass  # blocked again by something else: the next round sees it

    def finish(self) -> None:
        if self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.stop()
        runs = 0
        wakes: Counter[str] = Counter()
        for name in self._names():
            runs += len(self._records(name, b"run.started"))
            wakes.update(r["data"]["trigger"] for r in self._records(name, b"wake.requested"))
        self.tally.runs = runs
        self.tally.wakes = dict(wakes)


def run_campaign(
    iterations: int,
    seed: int,
    *,
    power_cut: bool = True,
    durability: str = "fsync",
    progress: bool = False,
) -> tuple[Tally, float]:
    started = time.monotonic()
    root = short_dir()
    campaign = Campaign(root, random.Random(seed), power_cut=power_cut, durability=durability)
    try:
        campaign.setup()
        for n in range(1, iterations + 1):
            campaign.round()
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
        if campaign.tally.failed:  # the evidence stays for whoever looks into it
            print(f"state dir and workspace kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return campaign.tally, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.campaign", description=__doc__)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--no-power-cut", action="store_true", help="kill -9 only")
    parser.add_argument(
        "--durability",
        choices=["fsync", "os"],
        default="fsync",
        help='the daemon\'s durability; with "os" only readability and consistency are checked',
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
