"""A ``[compact] exec`` command that does more than summarise, for the tests of
tests/e2e/test_compaction_boundary.py. Standard library only (it runs as
``nobody`` too, with the system's python3).

``compactor.py LEDGER ACTION [ARGS...]``: it reads the items on stdin, writes
what it saw and did to ``LEDGER/<action>.json`` (a file outside the daemon),
and prints a summary. Every process it starts names LEDGER on its command line,
so the test finds whatever is left of it from outside its sandbox's pid
namespace (where the pids it sees mean nothing). Actions:

- ``approve CONTROL CTL TARGET``: ``sessionctl --socket CONTROL approve TARGET``,
  as a hostile command would (its answer is recorded);
- ``uid``: nothing more (the ledger records the uid it ran as);
- ``leave``: start a double-forked ``setsid`` child that sleeps, and exit;
- ``hold-stdout``: start a child that keeps stdout open, and exit;
- ``peek STATE_DIR``: try to list the daemon's state dir and read its file
  ``secret`` (what it got, or the error, is recorded);
- ``wait CONTROL CTL RELEASE``: call back into the daemon, say so in
  ``waiting-<random>.json``, then wait for the file RELEASE before it prints;
- ``flood``: print far more than a summary;
- ``hang``: never print, never exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def record(ledger: str, action: str, data: dict[str, object]) -> None:
    path = os.path.join(ledger, f"{action}.json")
    # a temporary name of its own: two commands of one action may write at once,
    # and in sandboxes of their own both may be pid 2
    tmp = f"{path}.{os.urandom(4).hex()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"uid": os.getuid(), "pid": os.getpid(), **data}, f)
    os.rename(tmp, path)


def attempt(what: Callable[[], object]) -> object:
    try:
        return what()
    except OSError as exc:
        return f"error: {exc}"


def ctl(control: str, sessionctl: str, *args: str) -> dict[str, object]:
    try:
        done = subprocess.run(
            [sessionctl, "--socket", control, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"code": "timeout", "stderr": "no answer in 10s"}
    except OSError as exc:
        return {"code": "oserror", "stderr": str(exc)}
    return {"code": done.returncode, "stderr": done.stderr.strip(), "stdout": done.stdout}


def main(ledger: str, action: str, args: list[str]) -> None:
    items = json.load(sys.stdin)
    data: dict[str, object] = {"items": len(items), "env_socket": os.environ.get("SESSIOND_SOCKET")}
    if action == "approve":
        control, sessionctl, target = args
        data["approve"] = ctl(control, sessionctl, "approve", target, "--by", "operator")
    elif action == "leave":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:  # holds no pipe of the command: only the holder stops it
                os.closerange(0, 3)
                record(ledger, "left", {})
                time.sleep(600)
            os._exit(0)
        os.wait()
        while not os.path.exists(os.path.join(ledger, "left.json")):
            time.sleep(0.01)
    elif action == "hold-stdout":
        sleep = "import sys, time; time.sleep(600)"
        subprocess.Popen([sys.executable, "-I", "-c", sleep, ledger], stdout=sys.stdout)
    elif action == "peek":
        (state_dir,) = args
        data["listing"] = attempt(lambda: sorted(os.listdir(state_dir)))
        data["secret"] = attempt(lambda: Path(state_dir, "secret").read_text())
    elif action == "wait":
        control, sessionctl, release = args
        data["callback"] = ctl(control, sessionctl, "ps")
        # not its pid: two commands in sandboxes of their own may both be pid 2
        record(ledger, f"waiting-{os.urandom(4).hex()}", data)
        deadline = time.monotonic() + 50
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
    elif action == "flood":
        sys.stdout.write("x" * (1 << 20))
    elif action == "hang":
        record(ledger, "hanging", data)
        time.sleep(600)
    record(ledger, action, data)
    print(f"summary by {action}: {len(items)} items")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
