"""The campaign's self-test: it must catch every deliberately broken build.

    python -m tests.faults.selftest [--rounds 12] [--seed N] [--only BREAK,...]

Each break of tests/faults/broken.py gets a short campaign against a daemon
started through that wrapper; the campaign stops at the first round whose table
has a violation. A break is caught when the invariant it names is among the
violations. Exit status 1 unless every break tried was caught.

Breaks 1 and 2 (fsync that does nothing, a directory fsync skipped) lose data only
when the power goes: the campaign's fallback power cut trusts the daemon's word
of what it fsynced, so it cannot see them. They are tried only where the fault
file system (tests/faults/faultfs.py) can be mounted, and reported as not tried
elsewhere (under CI=true, not tried is a failure).

The campaign's runs are confined (bubblewrap, a uid per session). Breaks 5 and 6
(orphan stopping off, the operator check off) remove a layer the sandbox backs
up: with it on, a run's orphans end with its pid namespace and no run sees the
control socket, so nothing shows. They are tried with the sandbox off, where
that layer alone stands in the way; the line says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from tests.faults import broken, faultfs
from tests.faults.campaign import run_campaign

NEEDS_POWER = ("fsync-noop", "dir-fsync-skipped")
# Breaks of a layer the sandbox backs up: with the runs confined nothing escapes
# even so (a run's pid namespace ends with it; a run never sees the control
# socket), so these are tried with the sandbox off, where the layer stands alone.
UNCONFINED = ("no-orphan-stop", "no-operator-check")


@dataclass
class Result:
    name: str
    what: str
    invariant: str
    caught: bool
    rounds: int
    violations: list[str]
    seconds: float
    error: str = ""

    def line(self) -> str:
        if self.error:
            verdict = f"NOT CAUGHT: the campaign failed ({self.error})"
        elif self.caught:
            verdict = f"caught by '{self.invariant}' in round {self.rounds}"
        else:
            seen = ", ".join(self.violations) or "no violation"
            verdict = f"NOT CAUGHT in {self.rounds} rounds ({seen})"
        off = " (sandbox off)" if self.name in UNCONFINED else ""
        return f"{self.name:<18} {self.what:<54} {verdict}{off} [{self.seconds:.0f} s]"


def try_break(name: str, rounds: int, seed: int) -> Result:
    what, invariant, _ = broken.BREAKS[name]
    wanted = set(invariant.split(" | "))
    command = [sys.executable, broken.__file__, name]
    started = time.monotonic()
    try:
        tally, _ = run_campaign(
            rounds, seed, command=command, until=lambda t: bool(wanted & set(t.violations())),
            sandbox=name not in UNCONFINED,
        )  # fmt: skip
    except Exception as exc:  # a broken build may break the harness too: say how
        where = traceback.extract_tb(exc.__traceback__)[-1]
        error = f"{exc!r} at {Path(where.filename).name}:{where.lineno}"
        return Result(name, what, invariant, False, 0, [], time.monotonic() - started, error)
    violations = tally.violations()
    caught = [v for v in violations if v in wanted]
    return Result(
        name, what, " | ".join(caught) or invariant, bool(caught), tally.rounds, violations,
        time.monotonic() - started,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.selftest", description=__doc__)
    parser.add_argument("--rounds", type=int, default=12, help="at most, per break")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--only", default="", help="comma-separated break names")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(broken.BREAKS)
    print(f"seed {args.seed}", flush=True)
    results = []
    why_not = faultfs.usable()
    untried = 0
    for name in names:
        if name in NEEDS_POWER and why_not is not None:
            what = broken.BREAKS[name][0]
            print(f"{name:<18} {what:<54} NOT TRIED: no fault file system ({why_not})", flush=True)
            untried += 1
            continue
        result = try_break(name, args.rounds, args.seed)
        results.append(result)
        print(result.line(), flush=True)
    missed = [r.name for r in results if not r.caught]
    print(f"{len(results) - len(missed)} of {len(results)} breaks tried caught")
    if untried and os.environ.get("CI") == "true":
        print("under CI=true every break must be tried")
        return 1
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
