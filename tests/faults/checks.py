"""What the campaign reads from the daemon's side after a kill: the log's records,
the calls a kill cut off (with their risk contracts), the restart's verdict on
each, the processes a run left behind, and secrets in the state dir.

The verdict a cut-off call must get is the campaign's own table
(``ledger.may_rerun_alone``), not the gate's code."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sessiond.codec import decode_line
from sessiond.log.store.base import Record
from sessiond.runs.leftovers import marked
from tests.faults.ledger import may_rerun_alone
from tests.patience import Patience


def records(log: Path, only: bytes = b"") -> list[Record]:
    """The complete lines of a log (the daemon may be writing the next one); with
    ``only``, just the events of that type."""
    try:
        data = log.read_bytes()
    except FileNotFoundError:
        return []  # lost with its folder's entry (a power cut): nothing of it is there
    out = []
    needle = b'"type":"' + only + b'"'
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        if only and needle not in line:
            continue
        record = decode_line(line)
        if record is None:
            raise AssertionError(f"{log}: a complete line fails its checksum: {line[:200]!r}")
        out.append(record)
    return out


def contract(risk: dict[str, Any]) -> str:
    return "/".join(
        (
            risk.get("idempotency") or "safe",
            risk.get("resume") or "rerun-after-check",
            risk.get("side_effect") or "workspace-write",
        )
    )


def cut_off_calls(log: Path) -> dict[str, str]:
    """Calls started and never finished nor resolved (call -> contract): what a
    kill cut off in the middle of its work. None if the session was blocked when
    the log ends: its calls were cut off by an earlier kill, the gate's verdict on
    them stands until a person resolves it, and the restart gives no new one (a
    judge that waited for one reported "no gate verdict after the restart" on
    good code: when the campaign read ``ps`` between the verdict and the block, it
    resolved nothing, and the next kill found the same calls)."""
    intents: dict[str, str] = {}
    started: set[str] = set()
    blocked = False
    for r in records(log):
        t, d = r["type"], r["data"]
        if t == "tool.intent":
            intents[d["call"]] = contract(d.get("risk") or {})
        elif t == "tool.started":
            started.add(d["call"])
        elif t == "tool.finished" or (t == "recovery.resolved" and d.get("call")):
            started.discard(d["call"])
        elif t == "recovery.resolved" and d.get("ends_turn"):
            started.clear()
        elif t == "lifecycle.changed":
            blocked = d.get("to") == "blocked"
    if blocked:
        return {}
    return {call: intents.get(call, "") for call in sorted(started)}


def first_verdict(log: Path, after_seq: int, patience: Patience) -> Record | None:
    """The restart's first ``gate.evaluated`` (not a dry run) after ``after_seq``;
    None once ``patience`` says the daemon will not write it (it died, or hung)."""
    while True:
        for r in records(log, b"gate.evaluated"):
            if r["seq"] > after_seq and not r["data"].get("dry_run"):
                return r
        if not patience.waiting():
            return None
        patience.pause()


def judge_verdict(
    calls: dict[str, str], verdict: Mapping[str, Any] | None
) -> tuple[str, str | None]:
    """('resumed' | 'blocked' | 'none', what is wrong or None) for the cut-off
    ``calls`` of one session and the restart's verdict on them."""
    if verdict is None:
        return "none", "no gate verdict after the restart"
    data = verdict["data"]
    if not data["ok"]:
        blocked = data.get("outcome") == "blocked" and data.get("options")
        return ("blocked", None) if blocked else ("blocked", f"held with no options: {data}")
    ask = [f"{c} ({k})" for c, k in calls.items() if not may_rerun_alone(k)]
    if ask:
        return "resumed", "resumed with no person: " + ", ".join(ask)
    return "resumed", None


def descends_from(pid: int, ancestor: int) -> bool:
    """Is ``ancestor`` in the PPid chain of ``pid``?"""
    current = pid
    for _ in range(4096):
        if current == ancestor:
            return True
        if current <= 1:
            return False
        try:
            with open(f"/proc/{current}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        current = int(stat[stat.rfind(b")") + 2 :].split()[1])
    return False


def orphans(state_dir: Path, daemon_pid: int, quiet: float = 10.0) -> dict[int, str]:
    """Processes of this state dir's runs (by the marker every run process carries)
    that the live daemon does not hold, still there after ``quiet`` seconds in which
    the daemon could run (tests/patience.py): the dead daemon's spawner, or
    the restart, should have stopped them."""
    patience = Patience(daemon_pid, quiet=quiet)
    while True:
        left = {
            pid: mark
            for pid, mark in marked(state_dir).items()
            if not descends_from(pid, daemon_pid)
        }
        if not left or not patience.waiting():
            return left
        patience.pause(0.1)


def secret_files(state_dir: Path, secret: bytes) -> list[str]:
    """Files under the state dir holding the secret's bytes."""
    found = []
    for folder, _dirs, files in os.walk(state_dir):
        for name in files:
            path = Path(folder) / name
            try:
                if secret in path.read_bytes():
                    found.append(str(path.relative_to(state_dir)))
            except OSError:
                continue  # a socket, or gone meanwhile
    return found


def running_from(folder: Path) -> list[int]:
    """Processes whose command line names a file under ``folder`` (what a broken
    build started from there, tests/faults/broken.py)."""
    needle = str(folder).encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def holders(mount: Path) -> list[int]:
    """Processes with a file or folder open (or their cwd) under ``mount``."""
    prefix = str(mount) + "/"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            links = [os.readlink(f"/proc/{entry}/cwd")]
            links += [
                os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")
            ]
        except OSError:
            continue
        if any(link == str(mount) or link.startswith(prefix) for link in links):
            found.append(int(entry))
    return found
