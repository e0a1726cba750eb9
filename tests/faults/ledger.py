"""The world's own record of what ran: the campaign's ledger, and the checks on it.

The daemon's log is what the daemon says happened; the ledger is what did. Every
piece of work of the workload appends one short line to one file (O_APPEND, in
the workspace, outside the state dir, so no power cut of the daemon's storage
touches it), and so does the campaign when it answers for the session:

    begin KEY CONTRACT   a step's fn, or a command run, starts its work
    end KEY              it did its work (its finish may still be unrecorded)
    ack KEY              the daemon acknowledged the finish (the SDK returned)
    rerun SESSION        the campaign resolved SESSION with --rerun (written first;
                         ``unrerun SESSION`` follows if the daemon refused it)
    accept SESSION / discard SESSION   the other two resolutions

KEY is what must not repeat: a step is ``SESSION.tTURN.SLOT`` (``run.key()``: the
turn and the ordinal, or the step's own key), a command run ``SESSION.tTURN``
(``$SESSIOND_TURN``, the same in every run of the turn). CONTRACT is
``idempotency/resume/side_effect``.

A second ``begin`` of a KEY is allowed only

- after a ``rerun`` of its session written since the previous ``begin`` (a
  person said so), counted as *rerun*; or
- when its contract lets the daemon run it again by itself (safe, or
  conditional with rerun-after-check/replay-from-event, writing only in the
  workspace) and it was not acknowledged, counted as *retried*.

Anything else is *executed twice*: a wrongful rerun. A KEY acknowledged finished
never begins again, whatever was resolved. The table here is the campaign's
own, written from docs/design.md section 5, not imported from the gate: a gate that
is wrong must not also be the judge.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def may_rerun_alone(contract: str) -> bool:
    """May the daemon run work of this contract again without asking anyone, when
    it was cut off? (docs/design.md section 5, the gate's risk table.)"""
    parts = contract.split("/")
    idempotency = parts[0]
    resume = parts[1] if len(parts) > 1 else "rerun-after-check"
    side_effect = parts[2] if len(parts) > 2 else "workspace-write"
    if idempotency == "unsafe" or resume in ("require-user-confirmation", "never-rerun"):
        return False
    return side_effect != "external-write"


def append(path: Path, line: str) -> None:
    """One line, one O_APPEND write: lines of concurrent writers never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@dataclass
class Judged:
    """What the ledger shows, by key."""

    executions: int = 0  # begin lines
    keys: int = 0  # distinct keys begun
    reruns: int = 0  # second begins a `resolve --rerun` allowed
    retried: int = 0  # second begins the contract allows without asking
    interrupted: int = 0  # begun, never ended (so far)
    twice: list[str] = field(default_factory=list)
    contracts: dict[str, str] = field(default_factory=dict)  # key -> contract
    acked: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)  # sessions with a key begun and ended


def session_of(key: str) -> str:
    return key.split(".t", 1)[0]


def judge(lines: list[str]) -> Judged:
    """Walk the ledger in order; see the module's docstring for the rules."""
    out = Judged()
    begun: dict[str, int] = {}  # key -> begins so far
    ended: set[str] = set()
    # key -> the sessions' rerun counts at its last begin (a rerun since then allows one)
    reruns_at: dict[str, int] = {}
    reruns: dict[str, int] = {}
    for raw in lines:
        parts = raw.split()
        if len(parts) < 2:
            continue  # a torn last line of a killed writer (not expected: one write)
        verb, what = parts[0], parts[1]
        if verb == "rerun":
            reruns[what] = reruns.get(what, 0) + 1
        elif verb == "unrerun":  # the resolve was refused: no rerun was allowed
            reruns[what] = reruns.get(what, 0) - 1
        elif verb == "begin":
            contract = parts[2] if len(parts) > 2 else ""
            out.executions += 1
            out.contracts.setdefault(what, contract)
            count = begun.get(what, 0)
            session = session_of(what)
            if count:
                if what in out.acked:
                    out.twice.append(f"{what} ran again after its finish was acknowledged")
                elif reruns.get(session, 0) > reruns_at[what]:
                    out.reruns += 1
                elif may_rerun_alone(contract):
                    out.retried += 1
                else:
                    out.twice.append(
                        f"{what} ({contract}) ran {count + 1} times with no resolve --rerun"
                    )
            begun[what] = count + 1
            reruns_at[what] = reruns.get(session, 0)
            ended.discard(what)
        elif verb == "end":
            ended.add(what)
            out.done.add(session_of(what))
        elif verb == "ack":
            out.acked.add(what)
    out.keys = len(begun)
    out.interrupted = sum(1 for k in begun if k not in ended)
    return out


def read(path: Path) -> list[str]:
    if not path.exists():
        return []
    data = path.read_text()
    return data[: data.rfind("\n") + 1].splitlines()
