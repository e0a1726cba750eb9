"""The supervision issue's hostile programs in the campaign, and the checks that
each stays contained (docs/design.md section 9: no process of a run outlives it).

Each is a command session woken every few seconds. Its processes carry the
campaign's marker in their command line (not only the daemon's mark in their
environment, which one of them drops), and a *ticker* among them appends
``tick KIND NONCE`` to the ledger four times a second for as long as it lives:

- ``h-holder``: the leader leaves a child holding stdout and exits at once;
- ``h-term``: a leader and child that ignore SIGTERM, stopped by ``timeout``;
- ``h-escape``: double fork, ``setsid``, and an ``env -i`` exec that drops the
  daemon's environment mark, into a ticker without the marker either: only the
  spawner's subreaper (or the cgroup) still knows it, and only the ledger shows
  it outlived its run;
- ``h-bomb``: a fork burst of 24 processes, bounded (``max_processes`` needs a
  pids controller, which the campaign's daemon does not get;
  tests/e2e/test_cgroups.py covers that bound);
- ``h-flood``: 32 MiB of output as fast as it can (the campaign's
  ``max_output_bytes`` keeps 256 KiB of it), then a wait stopped by ``timeout``.

Together they cover the two risk-contract values the other sessions do not
(``unsafe/never-rerun``, side effects ``none`` and ``read``). The checks:

- after a restart, no process with the marker outside the new daemon's tree
  (an *orphan*, counted with the environment-mark ones);
- after a clean stop of the daemon, no process with the marker at all;
- no ticker that ticked before a kill (or a stop) ticks after the restart has
  settled (or after the stop): *work after its run was stopped*;
- a ``ping`` answered within ``SLOW`` seconds all along: *the daemon stays
  responsive* under the flood and the bomb.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
import time
from pathlib import Path

from sessiond.runs.leftovers import marked
from sessiond.wire import Connection, RemoteError
from tests.faults.checks import descends_from
from tests.faults.tally import Tally

SLOW = 10.0  # a ping slower than this (seconds) counts: the machine is loaded, not idle
# a ticker: sh with the marker as its $0 (the escapee's: not even that), the ledger as $1
TICKER = 'n=$(date +%s%N); while :; do echo "tick {kind} $n $$" >> "$1"; sleep 0.25; done'
PROGRAMS = {  # name: (contract, timeout, the shell script; {tick} is a ticker command)
    "h-holder": ("safe/replay-from-event/none", "20s", "{tick} & echo started"),
    "h-term": (
        "conditional/rerun-after-check/read",
        "1s",
        "trap '' TERM; {tick} & while :; do sleep 1; done",
    ),
    "h-escape": (
        "unsafe/never-rerun/none",
        "2s",
        "( setsid sh -c '( exec env -i {tick} ) &' & ); sleep 30",
    ),
    "h-bomb": (
        "safe/rerun-after-check/read",
        "2s",
        "{tick} & i=0; while [ $i -lt 23 ]; do sh -c 'sleep 30; :' {mark} & i=$((i+1)); done; wait",
    ),
    "h-flood": (
        "safe/replay-from-event/read",
        "2s",
        "{tick} & yes flood-{mark} | head -c 33554432; sleep 30",
    ),
}

SPEC = """name = "{name}"
[run]
exec = ["sh", "-c", {script}, "{mark}"]
cwd = "."
env = {{ LEDGER = "{ledger}" }}
idempotency = "{idempotency}"
resume = "{resume}"
side_effect = "{side_effect}"
timeout = "{timeout}"
retries = 0
[[trigger]]
type = "every"
interval = "3s"
"""


def mark_for(ledger_path: Path) -> str:
    """The campaign's marker: unique to its ledger (so to its temporary root)."""
    return "hostile-" + hashlib.sha256(str(ledger_path).encode()).hexdigest()[:16]


def specs(ledger_path: Path) -> dict[str, str]:
    """The hostile sessions' spec texts, by name."""
    mark = mark_for(ledger_path)
    out = {}
    for name, (contract, timeout, script) in PROGRAMS.items():
        kind = name.removeprefix("h-")
        zero = "escapee" if name == "h-escape" else mark  # invisible but to the ledger
        tick = f"sh -c '{TICKER.format(kind=kind)}' {zero} {ledger_path}"
        body = f'echo "begin {name}.t$SESSIOND_TURN {contract}" >> "$LEDGER"; ' + script.format(
            tick=_nested(tick) if name == "h-escape" else tick, mark=mark
        )
        idempotency, resume, side_effect = contract.split("/")
        out[name] = SPEC.format(
            name=name, script=_toml(body), mark=mark, ledger=ledger_path,
            idempotency=idempotency, resume=resume, side_effect=side_effect, timeout=timeout,
        )  # fmt: skip
    return out


def _nested(command: str) -> str:
    """``command`` inside a single-quoted sh string (h-escape's setsid'd shell)."""
    return command.replace("'", "'\\''")


def _toml(text: str) -> str:
    """A TOML literal-free basic string of ``text``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def running(mark: str) -> list[int]:
    """Every live process whose command line carries ``mark`` (the whole table)."""
    needle = mark.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Containment:
    """The checks above, on one campaign's ledger and marker."""

    def __init__(self, ledger_path: Path, tally: Tally) -> None:
        self.ledger = ledger_path
        self.mark = mark_for(ledger_path)
        self.tally = tally
        self.offset = 0  # the ledger's size when everything before was last stopped
        self.stopped: set[str] = set()  # tickers that ticked before then
        self.pending: set[str] = set()  # tickers seen at the last kill or stop

    def _ticks(self, start: int = 0) -> list[tuple[int, str]]:
        """(pid, KIND NONCE) of each tick line at or after ``start``."""
        try:
            with open(self.ledger, "rb") as f:
                f.seek(start)
                data = f.read()
        except FileNotFoundError:
            return []
        out = []
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            fields = line.decode().split()
            if fields[0] == "tick" and len(fields) == 4:
                out.append((int(fields[3]), " ".join(fields[1:3])))
        return out

    def stopping(self) -> None:
        """The daemon is dead or stopped: every ticker seen so far must stop ticking
        once the restart (or the stop) has settled."""
        self.pending = {who for _, who in self._ticks(self.offset)}

    def settled(self, what: str) -> None:
        """The restart (or the stop) has settled: the ticks since the last settled
        point are judged, and from here on no ticker seen before ``stopping`` may
        tick (new runs' tickers are new)."""
        self.check_late(what)
        self.stopped |= self.pending
        self.pending = set()
        self.offset = self.ledger.stat().st_size if self.ledger.exists() else 0

    def check_late(self, what: str) -> None:
        t = self.tally
        for pid, who in self._ticks(self.offset):
            if who in self.stopped:
                t.late_work.append(
                    f"round {t.rounds}: ticker {who} (pid {pid}) ticked after {what}"
                )
                self.stopped.discard(who)  # once each
                kill([pid] if pid in running(str(self.ledger)) else [])  # (not a reused pid)

    def orphans(self, daemon_pid: int, timeout: float = 10.0) -> None:
        """After a restart: marked processes outside the new daemon's tree, still
        there after ``timeout`` (the dead daemon's spawner or the restart must stop
        them; a restart's new runs are inside its tree)."""
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in running(self.mark) if not descends_from(p, daemon_pid)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        t = self.tally
        for pid in left:
            t.orphans.append(f"round {t.rounds}: pid {pid} ({_cmdline(pid)})")
        kill(left)

    def after_stop(self, state_dir: Path, timeout: float = 5.0) -> None:
        """After a clean stop: no process of any run left, by the marker or the
        daemon's mark (a stop waits for its runs, so there is little to wait for)."""
        self.stopping()
        deadline = time.monotonic() + timeout
        while (left := self._left(state_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        t = self.tally
        t.stops += 1
        for pid in left:
            t.left_after_stop.append(f"round {t.rounds}: pid {pid} ({_cmdline(pid)})")
        kill(left)
        self.settled("the daemon stopped")

    def _left(self, state_dir: Path) -> list[int]:
        return sorted({*running(self.mark), *marked(state_dir)})

    def quiet(self, seconds: float = 1.0) -> None:
        """At the end: a ticker ticks four times a second, so ``seconds`` without a
        tick of a stopped one shows none lives on unseen."""
        time.sleep(seconds)
        self.check_late("the daemon stopped")

    def power_off(self) -> None:
        """A power cut stops every program (the ones without the daemon's mark too,
        and the escapee, found here by the ledger on its command line; the checks
        above do not look for that)."""
        kill(sorted({*running(self.mark), *running(str(self.ledger))}))


class Pinger:
    """Pings the daemon through a round; the slowest answer goes in the tally."""

    def __init__(self, socket: Path, tally: Tally) -> None:
        self.socket = socket
        self.tally = tally
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Pinger:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(SLOW + 30)

    def _run(self) -> None:
        t = self.tally
        try:
            conn = Connection(self.socket, timeout=SLOW + 20)
        except RemoteError:
            return
        with conn:
            while not self.stop.wait(0.2):
                began = time.monotonic()
                try:
                    conn.call("ping", {})
                except RemoteError:
                    return  # the daemon was killed: a dead one is not an unresponsive one
                took = time.monotonic() - began
                t.slowest_ping = max(t.slowest_ping, took)
                if took > SLOW and not self.stop.is_set():
                    t.unresponsive.append(f"round {t.rounds + 1}: ping took {took:.1f} s")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "gone"
