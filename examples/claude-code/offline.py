"""Run the claude-code example offline: the real Claude Code CLI and a real
sessiond, the model a scripted Anthropic-compatible endpoint on loopback (the
one the tests use, tests/agents/anthropic_stub.py). No API key, no network.

    make example-claude-code          # from the repo's root; installs what it needs
    .venv/bin/python examples/claude-code/offline.py [--keep]

It starts the endpoint and a daemon of its own (a temporary state dir and
socket), copies this example there, and walks through it with sessionctl: a
message wakes the session, the CLI reads notes.txt (allowed), asks to write
summary.txt (the policy asks a person), the session waits blocked, the
approval lets the resumed CLI write it once. With --keep the daemon stays up
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from tests.agents.anthropic_stub import Endpoint, Turn, text, tool  # noqa: E402

BIN = Path(sys.executable).parent  # the venv's sessiond and sessionctl
CLI_BIN = ROOT / "tests" / "agents" / "node_modules" / ".bin"


def script(workspace: Path) -> list[Turn]:
    """What the scripted model answers, one turn per request of the CLI."""
    summary = {
        "file_path": str(workspace / "summary.txt"),
        "content": "Release 2.4: API freeze Feb 24, billing page ships Mar 3; "
        "Ana has the migration guide, Ben the changelog.\n",
    }
    return [
        Turn(tool("Read", file_path=str(workspace / "notes.txt")), input_tokens=900),
        Turn(text("I will write the summary."), tool("Write", **summary), input_tokens=1100),
        # the run after the approval resumes the CLI's session: the model asks again
        Turn(tool("Write", **summary), input_tokens=1300),
        Turn(text("summary.txt now holds a one-line summary of notes.txt."), input_tokens=1400),
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

    def state(self) -> str:
        shown: dict[str, Any] = json.loads(self.ctl("--json", "show", "claude-code", show=False))
        return str(shown["state"])

    def expect_approval(self) -> None:
        """Blocked on the Write, or the run failed (the CLI not found, say): then its
        stderr, rather than a puzzling "no pending approval" from the next step."""
        shown: dict[str, Any] = json.loads(self.ctl("--json", "show", "claude-code", show=False))
        if not str(shown.get("reason", "")).startswith("approval pending"):
            self.ctl("output", "claude-code", "--stderr")
            raise SystemExit(
                "the run failed before the model asked to write (its stderr is above); "
                f"the daemon's log is {self.root / 'sessiond.log'}"
            )

    def wait_state(self, want: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.1
        while self.state() != want:
            if time.monotonic() > deadline:
                raise SystemExit(f"the session did not become {want} in {timeout:g}s")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the daemon running")
    args = parser.parse_args()
    if not (CLI_BIN / "claude").exists():
        print(f"the Claude Code CLI is not at {CLI_BIN}: run `make agents` (Node.js, npm)")
        return 2
    root = Path(tempfile.mkdtemp(prefix="sessiond-cc-"))
    example = root / "claude-code"
    shutil.copytree(HERE, example, ignore=shutil.ignore_patterns("offline.py", "__pycache__"))
    workspace = example / "workspace"
    tour = Tour(root)
    with Endpoint(script(workspace)) as endpoint:
        env = dict(tour.env)
        env.update(
            ANTHROPIC_BASE_URL=endpoint.url,
            ANTHROPIC_API_KEY="offline-not-a-key",
            CLAUDE_CODE_MAX_RETRIES="0",  # a request past the script fails at once
            PATH=f"{CLI_BIN}:{env['PATH']}",  # `claude` for the spec's default cli
        )
        (root / "sessiond.toml").write_text("")
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
            print(f"sessiond is running on {root / 's.sock'}; the model is scripted.\n")
            tour.ctl("create", str(example / "claude-code.toml"))
            tour.ctl("send", "claude-code", "Please summarize the notes.")
            tour.wait_state("blocked")
            tour.ctl("show", "claude-code")  # approval pending: Write
            tour.expect_approval()
            tour.ctl("approve", "claude-code")
            tour.wait_state("sleeping")
            print(f"$ cat workspace/summary.txt\n{(workspace / 'summary.txt').read_text()}")
            tour.ctl("show", "claude-code")  # sleeping after its 2 runs, for the next message
            tour.ctl("log", "claude-code", "--type", "policy.decided")
            tour.ctl("log", "claude-code", "--type", "model.responded")
            tour.ctl("replay", "claude-code", "--view", "messages")
            print(f"The model answered {len(endpoint.requests)} requests.")
            if args.keep:
                print(f"\nThe daemon stays up. In another terminal:\n"
                      f"  export SESSIOND_SOCKET={root / 's.sock'} PATH={BIN}:$PATH\n"
                      "  sessionctl show claude-code\nCtrl-C stops it.")  # fmt: skip
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
