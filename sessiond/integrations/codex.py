"""The driver of a ``kind = "codex"`` run: the Codex CLI headless.

The daemon starts this module as the run's program (an ``sdk`` program). It runs
``codex exec --json PROMPT`` (``codex exec resume THREAD --json PROMPT`` once the
session has a Codex thread) in the workspace, with a private ``HOME`` and
``CODEX_HOME`` kept from run to run under the state dir, and a config written
there at every start:

- **the model through the gateway**: a model provider ``sessiond`` whose
  ``base_url`` is the run's ``OPENAI_BASE_URL`` (the daemon's gateway, the
  Responses route: ``wire_api = "responses"``) and whose key is the run's token
  (``env_key = "OPENAI_API_KEY"``). The gateway records each call
  (``model.requested``/``model.responded``), counts it against the budgets and
  schedules it; the CLI's own retries are off (the gateway retries upstream);
- **tools decided by the session's policy**: ``PreToolUse``/``PostToolUse`` hooks
  (sessiond.integrations.codex_hook) make every tool call a durable step;
- **one boundary**: ``sandbox_mode = "danger-full-access"`` and ``approval_policy
  = "never"``. The run is confined by sessiond's sandbox already (bubblewrap:
  the workspace writable, the rest read-only, ``[run] network``); the CLI's own
  sandbox inside it would need user namespaces a nested sandbox may not have, and
  its approvals cannot be answered headless. The policy, through the hook, is
  what asks a person.

The CLI's hooks run only where trusted (``--dangerously-bypass-hook-trust`` trusts
those of its config, which is this driver's; a workspace's ``.codex/`` is an
untrusted project's, which the CLI does not load). As a second line, the driver
stops the CLI and fails the run when a command starts that no hook allowed.

A tool on the ``ask`` list stops the CLI and ends the run: the session waits
``blocked`` until a person answers; the next run resumes the CLI's thread and
tells the model the answer (docs/agents.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from sessiond.integrations.claude_code import QUIET_ENV, TurnFiles
from sessiond.sdk import Run, StopRun, connect

# JSON items of the CLI that run something of the host: each needs a hook's "run".
RUNS_SOMETHING = frozenset({"command_execution", "file_change", "mcp_tool_call"})


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


def config_toml(base_url: str, hook: list[str]) -> str:
    """The CLI's config: the gateway as its only model provider, the hooks, no
    sandbox or approvals of its own, nothing sent besides the model's calls."""
    command = " ".join(_shell(a) for a in hook)
    lines = [
        'model_provider = "sessiond"',
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        "check_for_update_on_startup = false",
        "[model_providers.sessiond]",
        'name = "sessiond"',
        f"base_url = {_toml(base_url)}",
        'env_key = "OPENAI_API_KEY"',
        'wire_api = "responses"',
        # the gateway absorbs 429s and retries upstream; a retry here would be a
        # second call, recorded as one
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "[analytics]",
        "enabled = false",
        "[features]",
        "hooks = true",
    ]
    for event, which in (("PreToolUse", "pre"), ("PostToolUse", "post")):
        # A hook that fails to start says nothing, and the CLI would run the call:
        # `|| exit 2` blocks it. No timeout: one that ran out would let it run too.
        script = f"{command} {which} || {{ echo 'sessiond: the tool hook failed' >&2; exit 2; }}"
        lines += [
            f"[[hooks.{event}]]",
            'matcher = "*"',
            f"[[hooks.{event}.hooks]]",
            'type = "command"',
            f"command = {_toml(script)}",
            "timeout = 86400",
        ]
    return "\n".join(lines) + "\n"


def _shell(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


class Driver:
    # the agent's settings table from the configuration: any TOML, Codex's own keys
    def __init__(self, run: Run, settings: dict[str, Any], home: Path) -> None:
        self.run = run
        self.s = settings
        self.home = home
        self.codex_home = home / ".codex"
        self.rundir = home / "runs" / run.run_id
        self.rundir.mkdir(parents=True, exist_ok=True)
        self.asked: list[str] = []  # notices from the hooks
        self.proc: subprocess.Popen[bytes] | None = None
        self.thread_id = ""
        self.started = 0  # items that ran something of the host
        self.unchecked = ""  # the first one no hook allowed
        # Codex's token usage JSON as its last turn.completed gave it (its own format)
        self.usage: dict[str, Any] = {}
        self.failed = ""
        self.seen_items: set[Any] = set()

    def argv(self, prompt: str, resume: str | None) -> list[str]:
        s = self.s
        argv = [s.get("cli") or "codex", "exec"]
        if resume:
            argv += ["resume"]
        argv += ["--json", "--skip-git-repo-check", "--dangerously-bypass-hook-trust"]
        if s.get("model"):
            argv += ["--model", s["model"]]
        if s.get("developer_instructions"):
            argv += ["-c", f"developer_instructions={_toml(s['developer_instructions'])}"]
        if resume:
            argv.append(resume)
        return [*argv, "--", prompt] if prompt.startswith("-") else [*argv, prompt]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(QUIET_ENV)
        env["HOME"] = str(self.home)
        env["CODEX_HOME"] = str(self.codex_home)
        env["SESSIOND_AGENT_RUNDIR"] = str(self.rundir)
        env.pop("SESSIOND_CODEX", None)
        return env

    def write_config(self) -> None:
        """Written at every start: what an earlier run (or a command the model ran)
        left in the private config does not count."""
        self.codex_home.mkdir(mode=0o700, parents=True, exist_ok=True)
        base_url = gateway_url(os.environ) or ""  # main() runs only through it
        hook = [sys.executable, "-m", "sessiond.integrations.codex_hook"]
        (self.codex_home / "config.toml").write_text(config_toml(base_url, hook))
        for stray in ("hooks.json", "requirements.toml", "managed_config.toml"):
            (self.codex_home / stray).unlink(missing_ok=True)

    # --- the stream -----------------------------------------------------------------

    # a line of `codex exec --json`: Codex's own event format, read with .get
    def line(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "thread.started":
            self.thread_id = str(event.get("thread_id") or self.thread_id)
            (self.home / "thread-id").write_text(self.thread_id)
        elif kind in ("item.started", "item.completed"):
            item = event.get("item") or {}
            if item.get("type") in RUNS_SOMETHING and item.get("id") not in self.seen_items:
                self.seen_items.add(item.get("id"))
                self.started += 1
                if self.started > self.allowed_total() and not self.unchecked:
                    self.unchecked = json.dumps(item)[:300]
                    self.stop_cli()
        elif kind == "turn.completed":
            self.usage = event.get("usage") or {}
        elif kind in ("turn.failed", "error"):
            err = event.get("error") or {}
            self.failed = str(err.get("message") if isinstance(err, dict) else err) or str(
                event.get("message") or kind
            )

    def allowed_total(self) -> int:
        """Calls the hooks allowed in this run: each left its hand-off."""
        n = 0
        with contextlib.suppress(OSError):
            for f in (self.rundir / "calls").glob("*.json"):
                with contextlib.suppress(OSError, ValueError):
                    n += json.loads(f.read_bytes()).get("status") == "run"
        return n

    # --- one CLI run ----------------------------------------------------------------

    def stop_cli(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def watch_notices(self) -> None:
        """The hooks' notices: a question stops the CLI (the run ends)."""
        notice = self.rundir / "notice"
        os.mkfifo(notice, 0o600)
        with open(notice, encoding="utf-8") as f:  # blocks until a writer opens it
            for raw in f:
                self.asked.append(raw.strip())
                # The CLI and its hooks: the asking hook never answers, so the
                # call it holds never runs.
                self.stop_cli()

    def cli(self, prompt: str, resume: str | None, cwd: str) -> int:
        self.write_config()
        threading.Thread(target=self.watch_notices, daemon=True).start()
        self.proc = subprocess.Popen(
            self.argv(prompt, resume), cwd=cwd, env=self.env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.line(event)
        finally:
            self.stop_cli()
            code = self.proc.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # a hook still holding a call
            # the notice pipe's reader may still wait for a writer: let it end
            with contextlib.suppress(OSError):
                os.close(os.open(self.rundir / "notice", os.O_WRONLY | os.O_NONBLOCK))
        return code


def store_transcript(run: Run, codex_home: Path, thread_id: str) -> None:
    """The thread's rollout, as an artifact of the session: a fork or another
    machine puts it back in place (sessiond.runs.agents.restore_transcript) and
    resumes the thread."""
    found = sorted((codex_home / "sessions").glob(f"*/*/*/rollout-*-{thread_id}.jsonl"))
    if not thread_id or not found:
        return
    data = found[-1].read_bytes()
    path = found[-1].relative_to(codex_home).as_posix()
    run.step(
        # the step sessiond.runs.agents restores a fork's thread from
        "codex.transcript", lambda: data, args={"thread_id": thread_id, "path": path},
        side_effect="none", idempotency="safe", resume="replay-from-event",
        key=f"cx.transcript.{run.run_id}", key_is_id=True,  # one per run
        observe=lambda _r: f"Codex thread {thread_id} ({len(data)} bytes)",
    )  # fmt: skip


def gateway_url(env: dict[str, str] | os._Environ[str]) -> str | None:
    """The run's OPENAI_BASE_URL where it is the daemon's gateway for this very run
    (``…/run/SESSION/RUN/v1``, set where the daemon has a ``[[model.provider]]``);
    None otherwise."""
    base = (env.get("OPENAI_BASE_URL") or "").rstrip("/")
    session, run = env.get("SESSIOND_SESSION"), env.get("SESSIOND_RUN")
    ok = bool(session and run) and base.endswith(f"/run/{session}/{run}/v1")
    return base if ok else None


def main() -> int:
    if gateway_url(os.environ) is None:
        # Its calls would go to whatever the environment names, unrecorded and
        # unbudgeted, with a key the run holds: it runs only through the gateway.
        print(
            "sessiond: a codex run sends its model calls through the daemon's model "
            "gateway, and this daemon has none: add a [[model.provider]] serving the "
            "session's model to the daemon's configuration (README, \"Models\")",
            file=sys.stderr,
        )
        return 2
    settings = json.loads(os.environ.get("SESSIOND_CODEX") or "{}")
    home = Path(os.environ["SESSIOND_AGENT_HOME"])
    with connect() as run:
        ctx = run.context()
        driver = Driver(run, settings, home)
        files = TurnFiles(home, "thread-id")
        resume, prompt = files.opening(run, ctx, settings)
        try:
            code = driver.cli(prompt, resume, os.getcwd())
        finally:  # this run's notice pipe and call hand-offs
            shutil.rmtree(driver.rundir, ignore_errors=True)
        files.remember(driver.thread_id)
        if driver.unchecked:
            # Fail closed: the CLI ran something its hooks never saw.
            print(
                f"sessiond: codex ran a call no hook allowed: {driver.unchecked}", file=sys.stderr
            )
            return 1
        if files.stopped(driver.asked):
            return 0
        store_transcript(run, driver.codex_home, driver.thread_id)
        if code != 0 or driver.failed:
            print(f"sessiond: codex exited with {code}: {driver.failed}", file=sys.stderr)
            return 1
        run.sleep()
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except StopRun as stop:
        print(f"sessiond: {stop}", file=sys.stderr)
        raise SystemExit(0) from None
