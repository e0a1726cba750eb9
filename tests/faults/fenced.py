"""The cluster campaign's ledger outside the database: examples/fenced-writer's
ledger service, written to by the ``fenced`` session's program with its run's
fencing token (``run.fence()``), several times a second for as long as it runs.

A whole-node freeze round (tests/faults/cluster.py) pauses the node that runs
``fenced`` for 5 x ``lease_ttl``, lets the others take its sessions over and run
them, then resumes it. The judge here: no attempt of the frozen node's programs
reached the ledger after the take-over (a write the holder's kill must have
prevented; the ledger's fence would refuse it, but it must not even be tried),
and the ledger never accepted an epoch below one it had accepted (the fence
itself).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE = Path(__file__).parents[2] / "examples" / "fenced-writer" / "ledger.py"
NAME = "fenced"

# Writes for a few seconds a run (its every trigger starts the next soon after),
# each attempt naming the node it runs on: the ledger records who tried, when.
PROGRAM = """import json, os, time, urllib.error, urllib.request
from sessiond.sdk import connect

url, node = os.environ["FENCED_LEDGER"], os.environ.get("SESSIOND_NODE", "")
with connect() as run:
    fence = run.fence()
    until = time.monotonic() + 4
    while time.monotonic() < until and not run.stop_requested:
        body = {"session": fence.session, "epoch": fence.epoch, "text": node, "pid": os.getpid()}
        request = urllib.request.Request(
            url + "/write", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            urllib.request.urlopen(request, timeout=5).read()
        except urllib.error.HTTPError:
            pass  # 409: refused, a later owner wrote (the ledger recorded the try)
        except OSError:
            pass
        time.sleep(0.01)
    run.sleep()
"""

SPEC = """name = "{name}"
goal = "write to a ledger outside the database, fenced by the session's epoch"
[run]
kind = "sdk"
exec = ["{python}", "fenced.py"]
cwd = "."
env = {{ FENCED_LEDGER = "{url}" }}
side_effect = "read"
idempotency = "safe"
retries = 0

[[trigger]]
type = "every"
interval = "1s"
"""


@dataclass
class Entry:
    session: str
    epoch: int
    node: str
    ok: bool
    at: float  # the machine's monotonic clock, when the ledger took the attempt


class FencedLedger:
    """The service, started once for the campaign; its file is the record."""

    def __init__(self, root: Path) -> None:
        self.file = root / "fenced-ledger.jsonl"
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVICE), "--port", "0", "--ledger", str(self.file)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # once it listens
        if not line.startswith("listening on "):
            raise RuntimeError(f"the fenced ledger did not start: {line!r}")
        self.url = line.split()[-1]

    def spec(self, ws: Path, python: str) -> Path:
        (ws / "fenced.py").write_text(PROGRAM)
        path = ws / f"{NAME}.toml"
        path.write_text(SPEC.format(name=NAME, python=python, url=self.url))
        return path

    def entries(self) -> list[Entry]:
        out = []
        for line in self.file.read_text().splitlines() if self.file.exists() else []:
            e: dict[str, Any] = json.loads(line)
            out.append(Entry(e["session"], e["epoch"], str(e["text"]), e["ok"], e["at"]))
        return out

    def tried_since(self, node: str, since: float) -> list[Entry]:
        return [e for e in self.entries() if e.node == node and e.at >= since]

    def stale_accepted(self) -> list[Entry]:
        """Writes the ledger accepted under an epoch below one it had accepted."""
        highest: dict[str, int] = {}
        found = []
        for e in self.entries():
            if e.ok and e.epoch < highest.get(e.session, e.epoch):
                found.append(e)
            if e.ok:
                highest[e.session] = max(highest.get(e.session, e.epoch), e.epoch)
        return found

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
