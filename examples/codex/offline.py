"""Run the codex example offline: the real Codex CLI and a real sessiond, the
CLI's model calls through the daemon's gateway to a scripted upstream on
loopback (sessiond.gateway.scripted, the one the tests and `make run` use). No
API key, no network.

    make example-codex                # from the repo's root; installs what it needs
    .venv/bin/python examples/codex/offline.py [--keep]

It starts the upstream and a daemon of its own (a temporary state dir and socket,
a `[[model.provider]]` pointing at the upstream), copies this example there, and
walks through it with sessionctl: a message wakes the session, the model asks to
run a shell command that writes summary.txt (the policy asks a person), the
session waits blocked, the approval lets the resumed CLI run it once. Every model
call is in the log as the gateway recorded it. With --keep the daemon stays up
afterwards for you to look around (it prints how), until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sessiond.gateway.scripted import Reply, Upstream, text, tool

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BIN = Path(sys.executable).parent  # the venv's sessiond and sessionctl
CLI_BIN = ROOT / "tests" / "agents" / "node_modules" / ".bin"

# The daemon's configuration: the scripted upstream as an OpenAI provider. The key
# is named by reference (the daemon's environment); the run never sees it.
CONFIG = """
[[model.provider]]
name = "openai"
kind = "openai"
base_url = "{url}/v1"
key_env = "OPENAI_OFFLINE_KEY"
models = ["gpt-6.1-*"]
concurrency = 4
rpm = 600
price_in = 1.25
price_out = 10.0
"""
SUMMARY = (
    "Release 2.4: API freeze Feb 24, billing page ships Mar 3; "
    "Ana has the migration guide, Ben the changelog."
)


def script() -> list[Reply]:
    """What the scripted model answers, one reply per call of the CLI."""
    write = tool("exec_command", cmd=f"printf '%s\\n' '{SUMMARY}' > summary.txt")
    again = dict(write, id=write["id"] + "b")
    return [
        Reply.of(text("I will write the summary."), write, input_tokens=900, output_tokens=60),
        # the run after the approval resumes the CLI's thread: the model asks again
        Reply.of(again, input_tokens=1100, output_tokens=40),
        Reply.of(
            text("summary.txt now holds a one-line summary of notes.txt."),
            input_tokens=1300,
            output_tokens=20,
        ),
    ]


class Tour:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = dict(os.environ, SESSIOND_SOCKET=str(root / "s.sock"))
        self.env["PATH"] = f"{BIN}:{self.env.get('PATH', '/usr/bin:/bin')}"

    def ctl(self, *args: str, show: bool = True) -> str:
        done = subprocess.run(
            [str(BIN / "sessionctl"), *args], env=self.env, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        if show:
            print(f"$ sessionctl {' '.join(args)}")
            print((done.stdout + done.stderr).rstrip() + "\n")
        if done.returncode != 0:
            raise SystemExit(f"sessionctl {args[0]} failed: {done.stderr.strip()}")
        return done.stdout

    def shown(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.ctl("--json", "show", "codex", show=False))
        return out

    def wait_state(self, want: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.1
        while (state := self.shown()["state"]) != want:
            if state == "failed" or time.monotonic() > deadline:
                self.ctl("output", "codex", "--stderr")
                raise SystemExit(f"the session did not become {want} ({state}); the daemon's "
                                 f"log is {self.root / 'sessiond.log'}")  # fmt: skip
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the daemon running")
    args = parser.parse_args()
    if not (CLI_BIN / "codex").exists():
        print(f"the Codex CLI is not at {CLI_BIN}: run `make agents` (Node.js, npm)")
        return 2
    root = Path(tempfile.mkdtemp(prefix="sessiond-cx-"))
    example = root / "codex"
    shutil.copytree(HERE, example, ignore=shutil.ignore_patterns("offline.py", "__pycache__"))
    workspace = example / "workspace"
    tour = Tour(root)
    with Upstream(script()) as upstream:
        env = dict(tour.env, OPENAI_OFFLINE_KEY="offline-not-a-key")
        env["PATH"] = f"{CLI_BIN}:{env['PATH']}"  # `codex` for the spec's default cli
        (root / "sessiond.toml").write_text(CONFIG.format(url=upstream.url))
        log = (root / "sessiond.log").open("wb")
        daemon = subprocess.Popen(
            [str(BIN / "sessiond"), "--config", str(root / "sessiond.toml"),
             "--state-dir", str(root / "state"), "--socket", str(root / "s.sock")],
            env=env, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not (root / "s.sock").exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"sessiond did not start: see {root / 'sessiond.log'}")
                time.sleep(0.05)
            print(f"sessiond is running on {root / 's.sock'}; its gateway sends the model's")
            print(f"calls to a scripted upstream at {upstream.url}.\n")
            tour.ctl("create", str(example / "codex.toml"))
            tour.ctl("send", "codex", "Please summarize the notes.")
            tour.wait_state("blocked")
            tour.ctl("show", "codex")  # approval pending: Bash
            tour.ctl("approve", "codex")
            tour.wait_state("sleeping")
            print(f"$ cat workspace/summary.txt\n{(workspace / 'summary.txt').read_text()}")
            tour.ctl("show", "codex")  # sleeping after its 2 runs, for the next message
            tour.ctl("log", "codex", "--type", "policy.decided")
            tour.ctl("log", "codex", "--type", "model.responded")  # the gateway's records
            print(f"The upstream answered {upstream.count} requests; the run held no key.")
            if args.keep:
                print(f"\nThe daemon stays up. In another terminal:\n"
                      f"  export SESSIOND_SOCKET={root / 's.sock'} PATH={BIN}:$PATH\n"
                      "  sessionctl show codex\nCtrl-C stops it.")  # fmt: skip
                with contextlib.suppress(KeyboardInterrupt):
                    signal.pause()
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
            log.close()
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
