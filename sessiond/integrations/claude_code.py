"""The driver of a ``kind = "claude-code"`` run: the Claude Code CLI headless.

The daemon starts this module as the run's program (an ``sdk`` program: steps,
approvals and replay are the SDK's). It runs ``claude -p PROMPT --output-format
stream-json --verbose`` with a private ``HOME``/``CLAUDE_CONFIG_DIR`` (kept from
run to run under the state dir), and reads the stream as it comes:

- each assistant message is a model step: ``model.requested``/``model.responded``
  with its tokens; the last one of a CLI run carries the run's totals and its
  cost (``cost_usd``: the result's ``total_cost_usd``, which counts the resumed
  CLI session's earlier runs, less what the events already carry);
- each tool call is a tool step. Calls the CLI asks about go through the
  permission tool (sessiond.integrations.claude_permission), which begins the
  step under the session's policy; calls it was told to allow up front
  (``allowed_tools``) or to refuse (the policy's ``deny``, as
  ``--disallowedTools``) are recorded here as the stream shows them. The end of
  each (``tool.finished`` with the result) is recorded from the tool result.

Where the daemon has a model gateway (a ``[[model.provider]]``), the run's
``ANTHROPIC_BASE_URL`` is the gateway's address for the run and its key the run's
token, so the CLI's calls go through it: the gateway records each one
(``model.requested``/``model.responded``, with the cost at the configured
prices) and the driver records no model steps of its own from the stream.

The CLI's session id is kept, so the next wake (and the next run of a turn)
continues it with ``--resume``; its transcript is stored as an artifact at the
end of every run (a ``claude-code.transcript`` step).

A tool on the ``ask`` list stops the CLI and ends the run: the session waits
``blocked`` until a person answers, then the next run resumes the CLI's session
and tells the model the answer (docs/agents.md).
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
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import orjson

from sessiond.integrations.claude_permission import risk_of
from sessiond.sdk import Run, StopRun, connect
from sessiond.sdkwire import ContextAnswer
from sessiond.wire import Connection, RemoteError

# Off: the CLI's own update checks, telemetry and other traffic besides the model.
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
# The CLI gives an MCP server 5 s to connect (MCP_CONNECT_TIMEOUT_MS) and then goes
# on without it. Without the permission tool a call the policy asks about is not
# put to a person: the CLI refuses it itself and asks the model again. Our server
# (Python, the MCP SDK) can take longer than that to start on a loaded machine,
# so the CLI waits for it.
MCP_ENV = {"MCP_CONNECT_TIMEOUT_MS": "120000", "MCP_TIMEOUT": "120000"}
PERMISSION_TOOL = "mcp__sessiond__permission"

# A line of Claude Code's stream-json output, or a message or a block in one: the
# CLI's own format, which changes between its versions, so it is read with .get.
CliJson = dict[str, Any]


class ClaudeSettings(TypedDict, total=False):
    """The session's ``[claude-code]`` settings, as SESSIOND_CLAUDE_CODE carries them."""

    cli: str
    model: str
    max_turns: int
    append_system_prompt: str
    bare: bool
    allowed_tools: list[str]
    deny: list[str]
    prompt: str


def through_gateway(env: dict[str, str] | os._Environ[str]) -> bool:
    """The run's model calls go to the daemon's gateway: ANTHROPIC_BASE_URL is the
    gateway's address for this very run (``…/run/SESSION/RUN``), which the daemon
    sets where it has a ``[[model.provider]]``. Otherwise it is whatever the
    daemon's environment or the spec gave (a provider, a proxy)."""
    base = (env.get("ANTHROPIC_BASE_URL") or "").rstrip("/")
    session, run = env.get("SESSIOND_SESSION"), env.get("SESSIOND_RUN")
    return bool(session and run) and base.endswith(f"/run/{session}/{run}")


def _wake_text(ctx: ContextAnswer) -> str:
    """The text of the messages waiting for this turn (a ``message`` wake), if any."""
    texts = [m.get("text") for m in ctx.get("mailbox") or [] if isinstance(m, dict)]
    return "\n\n".join(t for t in texts if isinstance(t, str) and t)


# approvals as the log's answers or the context's records have them (read by key)
def _approvals(run: Run, ctx: ContextAnswer, call: str) -> list[Mapping[str, Any]]:
    """The answer to ``call`` from the log (``log`` is granted by default): the
    context is the session as the turn began, before the answer. (Approvals as the
    log's answers or the context's records have them: read by key.)"""
    try:
        with Connection(Path(os.environ["SESSIOND_SOCKET"]), 30,
                        token=os.environ["SESSIOND_TOKEN"]) as conn:  # fmt: skip
            answers = ["approval.granted", "approval.denied"]
            records = conn.call("log", {"name": run.session, "limit": 20, "types": answers})
        return [
            dict(r["data"], status="granted" if r["type"] == "approval.granted" else "denied")
            for r in records
            if isinstance(r, dict) and r.get("data", {}).get("call") == call
        ]
    except (RemoteError, OSError, KeyError, TypeError):  # `log` not granted
        return list(ctx.get("approvals") or [])


# _approvals' answers: read by key
def _answer_note(approvals: Sequence[Mapping[str, Any]], call: str) -> str:
    """What the model is told of a person's answer to the question the last run
    stopped at."""
    for a in approvals:
        if a.get("call") != call:
            continue
        tool = a.get("tool", "the tool")
        if a.get("status") == "denied":
            why = f": {a['reason']}" if a.get("reason") else ""
            return (
                f"sessiond: a person denied your call to {tool}{why}. It was not run; do not "
                "make it again."
            )
        if a.get("status") == "granted":
            return (
                f"sessiond: a person approved your call to {tool}. Make the call again: it "
                "runs now, once."
            )
    return ""


def _text_of(message: CliJson) -> str:
    parts = []
    for block in message.get("content") or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            parts.append(f"[{block.get('name')} {orjson.dumps(block.get('input')).decode()}]")
    return "\n".join(parts)


def _result_text(block: CliJson) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return str(content or "")


class Driver:
    def __init__(self, run: Run, settings: ClaudeSettings, home: Path) -> None:
        self.run = run
        self.s = settings
        self.home = home
        self.rundir = home / "runs" / run.run_id
        self.rundir.mkdir(parents=True, exist_ok=True)
        self.pending: CliJson | None = None  # the assistant message being read
        self.tools: dict[str, CliJson] = {}  # tool_use_id -> its block
        self.asked: list[str] = []  # notices from the permission tool
        self.proc: subprocess.Popen[bytes] | None = None
        self.session_id = ""
        self.cost = 0.0
        self.reported = False  # the result line came: self.cost is this CLI run's
        self.cost_before = 0.0  # of the CLI session's cost, what events already carry
        self.totals = (0, 0)
        self.recorded = [0, 0]
        self.flushed: set[Any] = set()  # ids of the responses recorded
        # The run's model calls go through the daemon's gateway, which records each
        # (model.requested / model.responded, tokens, cost) and counts it against
        # the budgets: the stream's copies are not recorded again.
        self.gateway = through_gateway(os.environ)

    # --- the CLI's command line and environment ---------------------------------------

    def argv(self, prompt: str, resume: str | None) -> list[str]:
        s = self.s
        mcp = {
            "mcpServers": {
                "sessiond": {
                    "type": "stdio",
                    "command": sys.executable,
                    "args": ["-m", "sessiond.integrations.claude_permission"],
                }
            }
        }
        config = self.rundir / "mcp.json"
        config.write_bytes(orjson.dumps(mcp))
        argv = [s.get("cli") or "claude", "-p", prompt, "--output-format", "stream-json"]
        argv += ["--verbose", "--mcp-config", str(config), "--strict-mcp-config"]
        argv += ["--permission-prompt-tool", PERMISSION_TOOL]
        # Settings only from the private config dir: a workspace's .claude/settings*.json
        # must not allow what the session's policy did not.
        argv += ["--setting-sources", "user"]
        if resume:
            argv += ["--resume", resume]
            self.cost_before = self.cost_recorded(resume)
        else:
            self.session_id = str(uuid.uuid4())
            argv += ["--session-id", self.session_id]
            self.record_cost(self.session_id, 0.0)
        if s.get("model"):
            argv += ["--model", s["model"]]
        if s.get("max_turns"):
            argv += ["--max-turns", str(s["max_turns"])]
        if s.get("append_system_prompt"):
            argv += ["--append-system-prompt", s["append_system_prompt"]]
        if s.get("bare"):
            argv.append("--bare")
        if s.get("allowed_tools"):
            argv += ["--allowedTools", ",".join(s["allowed_tools"])]
        if s.get("deny"):
            # Pre-allowed and read-only tools never reach the permission tool: the
            # policy's denials must be the CLI's own rules too.
            argv += ["--disallowedTools", ",".join(s["deny"])]
        return argv

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(QUIET_ENV)
        env.update(MCP_ENV)
        env["HOME"] = str(self.home)
        env["CLAUDE_CONFIG_DIR"] = str(self.home / ".claude")
        env["SESSIOND_AGENT_RUNDIR"] = str(self.rundir)
        env.pop("SESSIOND_CLAUDE_CODE", None)
        return env

    # --- the stream -----------------------------------------------------------------

    def line(self, event: CliJson) -> None:
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "init":
            self.session_id = str(event.get("session_id") or self.session_id)
            (self.home / "session-id").write_text(self.session_id)
            return
        if kind == "assistant":
            message = event.get("message") or {}
            if self.pending is not None and self.pending.get("id") != message.get("id"):
                self.flush()
            uses = [b for b in message.get("content") or [] if b.get("type") == "tool_use"]
            for block in uses:
                self.tools[block["id"]] = block
            if message.get("id") in self.flushed:
                return  # one more tool call of a response already recorded
            if self.pending is None:
                self.pending = dict(message, content=list(message.get("content") or []))
            else:
                self.pending["content"].extend(message.get("content") or [])
            if uses:
                # Recorded now, before the CLI asks about the call (a question ends
                # the run: the response must be in the log by then).
                self.flush()
            return
        if kind == "result":
            total = float(event.get("total_cost_usd") or 0.0)
            # The CLI's total counts the resumed session's earlier runs (its
            # transcript's cost state); each run's events carry what that run cost.
            self.cost = total - self.cost_before if total >= self.cost_before else total
            self.reported = True
            if self.pending is not None:
                # Before the reply that carries it is recorded: a crash between the
                # two loses this run's cost, never counts it twice. With no reply
                # left to carry it (the last one asked for a tool: max_turns), the
                # next run's figure counts it.
                self.record_cost(self.session_id, total)
            usage = event.get("usage") or {}
            tin = sum(int(usage.get(k) or 0) for k in ("input_tokens",
                      "cache_creation_input_tokens", "cache_read_input_tokens"))  # fmt: skip
            self.totals = (tin, int(usage.get("output_tokens") or 0))
            self.flush(last=True)
            return
        self.flush()
        if kind == "user":
            for block in (event.get("message") or {}).get("content") or []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    self.tool_result(block)

    def flush(self, *, last: bool = False) -> None:
        message, self.pending = self.pending, None
        if message is None:
            return
        self.flushed.add(message.get("id"))
        if not self.gateway:
            self.record(message, last=last)
        # The permission tool waits for this before it asks about the response's
        # calls (claude_permission.Asker.wait_recorded). Through the gateway the
        # response is on record once the CLI has it whole.
        recorded = self.rundir / "recorded"
        recorded.mkdir(exist_ok=True)
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("id"):
                (recorded / str(block["id"])).touch()

    # a stream-json message of the CLI: its own format, read with .get
    def record(self, message: dict[str, Any], *, last: bool) -> None:
        """A response as a model step, from the stream: without the gateway, the
        daemon sees the model's calls only here."""
        usage = message.get("usage") or {}
        tin = int(usage.get("input_tokens") or 0) + int(usage.get("cache_read_input_tokens") or 0)
        tout = int(usage.get("output_tokens") or 0)
        if last and self.totals != (0, 0):
            # The stream's per-message usage is what the API reported at its start;
            # the run's totals (in the result) make the sum right.
            tin = max(tin, self.totals[0] - self.recorded[0])
            tout = max(tout, self.totals[1] - self.recorded[1])
        self.recorded[0] += tin
        self.recorded[1] += tout
        response = dict(message, session_id=self.session_id)
        cost = round(self.cost, 6) if last and self.reported else None
        if cost is not None:
            response["cost_usd"] = cost
        request = {"claude_session": self.session_id, "message": message.get("id")}
        self.run.model_call(
            str(message.get("model") or self.s.get("model") or "claude"),
            request,
            lambda: response,
            key=f"cc.{message.get('id') or uuid.uuid4()}",
            usage=lambda _r: (tin, tout),
            text=lambda _r: _text_of(message),
            cost=lambda _r: cost,
        )

    def tool_result(self, block: CliJson) -> None:
        use_id = str(block.get("tool_use_id") or "")
        use = self.tools.get(use_id, {"name": "unknown", "input": {}})
        name, tool_input = str(use.get("name")), use.get("input") or {}
        error = bool(block.get("is_error"))
        text = _result_text(block)
        handed = self.rundir / "calls" / f"{use_id}.json"
        if handed.exists():  # the permission tool asked the daemon about it
            began = orjson.loads(handed.read_bytes())
            if began.get("status", "run") != "run":
                return  # denied (recorded so), or finished earlier in the turn: not run
            call = began["call"]
        else:  # allowed up front, or refused by --disallowedTools: never asked
            answer = self.run._call(
                "sdk.step", kind="tool", name=name, ordinal=1, key=f"cc.{use_id}",
                key_is_id=True, args=tool_input, risk=risk_of(name),
            )  # fmt: skip
            if answer.get("status") != "run":
                return  # denied (recorded with the policy's rule), or the run stops
            call = answer["call"]
        seen = f"{name}: {text[:200]}"
        if error:
            self.run._call("sdk.step_done", call=call, observation=seen, status="error",
                           error=text[:60_000], error_class="execution")  # fmt: skip
        else:
            self.run._call("sdk.step_done", call=call, observation=seen, status="ok", result=text)

    # --- one CLI run ----------------------------------------------------------------

    def watch_notices(self) -> None:
        """The permission tool's notices: a question stops the CLI (the run ends)."""
        notice = self.rundir / "notice"
        os.mkfifo(notice, 0o600)
        with open(notice, encoding="utf-8") as f:  # blocks until a writer opens it
            for raw in f:
                self.asked.append(raw.strip())
                if self.proc is not None and self.proc.poll() is None:
                    # The CLI alone: its permission server (same process group) must
                    # outlive it. A server gone first fails the pending call with
                    # "Connection closed", and a CLI still shutting down asks the
                    # model again with that error (seen on a loaded machine).
                    os.kill(self.proc.pid, signal.SIGTERM)

    def cli(self, prompt: str, resume: str | None, cwd: str) -> int:
        threading.Thread(target=self.watch_notices, daemon=True).start()
        self.proc = subprocess.Popen(
            self.argv(prompt, resume), cwd=cwd, env=self.env(), stdout=subprocess.PIPE,
            start_new_session=True,
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
            self.flush(last=True)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
            code = self.proc.wait()
            # what the CLI left of its group: the permission server still waiting
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            # the notice pipe's reader may still wait for a writer: let it end
            with contextlib.suppress(OSError):
                os.close(os.open(self.rundir / "notice", os.O_WRONLY | os.O_NONBLOCK))
        return code

    def transcript(self, session_id: str) -> Path | None:
        found = list((self.home / ".claude" / "projects").glob(f"*/{session_id}.jsonl"))
        return found[0] if found else None

    def record_cost(self, session_id: str, total: float) -> None:
        data = {"session": session_id, "total": total}
        (self.home / "cost-recorded").write_bytes(orjson.dumps(data))

    def cost_recorded(self, session_id: str) -> float:
        """Of the CLI session's running total, what the session's events carry: the
        total of its last reported run. A run stopped by a question reports none,
        but the CLI saves its cost state when stopped: the next run's total counts
        it, and its events carry it. A fork (or an import) has only the
        transcript: its cost state, which the parent's events carried."""
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            data = orjson.loads((self.home / "cost-recorded").read_bytes())
            if data["session"] == session_id:
                return float(data["total"])
        return self.cost_of(session_id)

    def cost_of(self, session_id: str) -> float:
        """What the CLI session had cost so far: its transcript's last cost state
        (the figure a resumed CLI starts its ``total_cost_usd`` from)."""
        path = self.transcript(session_id)
        total = 0.0
        if path is None:
            return total
        with path.open("rb") as f:
            for raw in f:
                if b'"cost-state"' not in raw:
                    continue
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    total = float(orjson.loads(raw).get("totalCostUSD") or 0.0)
        return total

    def store_transcript(self) -> None:
        """The CLI's transcript, as an artifact of the session: a fork or another
        machine can put it back in place and ``--resume``."""
        found = self.transcript(self.session_id)
        if found is None:
            return
        data = found.read_bytes()
        path = found.relative_to(self.home / ".claude").as_posix()
        self.run.step(
            "claude-code.transcript", lambda: data,
            args={"session_id": self.session_id, "path": path},
            side_effect="none", idempotency="safe", resume="replay-from-event",
            key=f"cc.transcript.{self.run.run_id}", key_is_id=True,  # one per run
            observe=lambda _r: f"Claude Code transcript {self.session_id} ({len(data)} bytes)",
        )  # fmt: skip


class TurnFiles:
    """What an agent CLI's driver keeps in the agent's home between the runs of a
    turn (this kind's and the Codex kind's): the CLI's own session or thread id, the
    turn it belongs to, and the call a person was asked about."""

    def __init__(self, home: Path, saved: str) -> None:
        self.saved, self.turn, self.asked = home / saved, home / "turn", home / "asked"

    def opening(
        self,
        run: Run,
        ctx: ContextAnswer,
        # the kind's table as SESSIOND_CLAUDE_CODE or SESSIOND_CODEX carries it: any TOML
        settings: Mapping[str, Any],
    ) -> tuple[str | None, str]:
        """(the CLI's id to resume, or None; the prompt of this run)."""
        resume = self.saved.read_text().strip() if self.saved.exists() else None
        same_turn = self.turn.exists() and self.turn.read_text().strip() == str(run.turn)
        asked = self.asked.read_text().strip() if self.asked.exists() else ""
        note = _answer_note(_approvals(run, ctx, asked), asked) if asked and resume else ""
        if same_turn and resume:
            # The turn goes on after a question (or a stop): the CLI's session resumes.
            prompt = note or "sessiond: this turn continues where it stopped."
        else:
            wake = _wake_text(ctx)
            prompt = "\n\n".join(p for p in (note, settings.get("prompt") or "", wake) if p)
            prompt = prompt or "Continue with your goal: " + (ctx.get("goal") or "")
        self.turn.write_text(str(run.turn))
        self.asked.unlink(missing_ok=True)
        return resume, prompt

    def remember(self, cli_id: str | None) -> None:
        if cli_id:
            self.saved.write_text(cli_id)

    def stopped(self, notes: Sequence[str]) -> bool:
        """Whether the CLI was stopped for a person's answer (or by the daemon): the
        turn goes on in a later run, which resumes the CLI's session."""
        questions = [n.split()[1] for n in notes if n.startswith("ask ")]
        if questions:
            self.asked.write_text(questions[-1])
        if any(n.startswith(("ask", "stop")) for n in notes):
            print(f"sessiond: the CLI was stopped: {notes[-1]}", file=sys.stderr)
            return True
        return False


def main() -> int:
    settings = json.loads(os.environ.get("SESSIOND_CLAUDE_CODE") or "{}")
    home = Path(os.environ["SESSIOND_AGENT_HOME"])
    with connect() as run:
        ctx = run.context()
        driver = Driver(run, settings, home)
        files = TurnFiles(home, "session-id")
        resume, prompt = files.opening(run, ctx, settings)
        cwd = os.getcwd()
        try:
            code = driver.cli(prompt, resume, cwd)
        finally:  # this run's MCP config, notice pipe and call hand-offs
            shutil.rmtree(driver.rundir, ignore_errors=True)
        files.remember(driver.session_id)
        if files.stopped(driver.asked):
            return 0
        driver.store_transcript()
        if code != 0:
            print(f"sessiond: claude exited with {code}", file=sys.stderr)
            return 1
        run.sleep()
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except StopRun as stop:
        print(f"sessiond: {stop}", file=sys.stderr)
        raise SystemExit(0) from None
