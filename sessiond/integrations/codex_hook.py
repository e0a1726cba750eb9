"""The tool hooks of a ``codex`` run: the Codex CLI runs this module before and
after every tool call (its ``PreToolUse`` / ``PostToolUse`` hooks, which the
driver, sessiond.integrations.codex, writes into the CLI's private config).

``pre``: the call becomes a durable step of the run's turn, asked of the daemon
over the run's program endpoint with the run's token (the CLI passes its
environment on to its hooks). The session's policy decides:

- ``run`` (allowed, or approved by a person earlier in the turn): the hook
  prints nothing and the CLI runs the call; its step id is left for ``post``;
- ``denied``: the call is blocked with the rule, which the model reads;
- ``replayed`` (the same call finished earlier in this turn): blocked, with its
  recorded result, so a finished call is never run twice;
- ``ask``: a person must answer. The driver is told (a line on its notice pipe)
  and stops the CLI; the hook never answers, so the call does not run. After
  ``sessionctl approve`` the next run resumes the CLI's session and the same
  call (by tool and input) runs, once.

``post``: the call's end (``tool.finished`` with the tool's output).

The CLI runs a hook's command through a shell, and treats a hook that fails
(any exit but 0 and 2) as having said nothing: the call would run unasked. So
every failure here blocks the call (a deny, or exit 2 with the reason on stderr),
and the driver's command line adds ``|| exit 2`` for a hook that could not even
start (docs/agents.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from sessiond.integrations.claude_permission import digest12, risk_of
from sessiond.wire import Connection, RemoteError

# How long a question holds the call before the hook blocks it itself: the driver
# stops the CLI long before (it is told at once); a hook that outlived a lost
# driver must still never let the call run.
ASK_HOLD = 600.0
# Codex's own tool names beside Claude Code's: its patch tool writes files in the
# workspace (as Edit does); its shell is "Bash". Anything else (MCP tools) is
# external-write, the safe default.
WORKSPACE_TOOLS = frozenset({"apply_patch"})


def codex_risk(tool: str) -> dict[str, str]:
    return risk_of("Edit" if tool in WORKSPACE_TOOLS else tool)


# Codex's hook answer JSON (its format, not ours)
def deny(reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }


class Hook:
    def __init__(self, env: dict[str, str]) -> None:
        self.socket = Path(env["SESSIOND_SOCKET"])
        self.token = env["SESSIOND_TOKEN"]
        self.session = env["SESSIOND_SESSION"]
        self.rundir = Path(env["SESSIOND_AGENT_RUNDIR"])
        self.calls = self.rundir / "calls"

    def key(self, tool: str, tool_input: Any) -> str:
        """The step's key: the same for the same call in every run of the turn (a
        resumed CLI makes it again with a new call id), the nth such call its own.
        Each hook is a process of its own: the counts live in the run's folder."""
        base = f"cx.{tool}.{digest12(tool, tool_input)}"
        with open(self.rundir / "seen.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # parallel calls each get their own n
            counts_file = self.rundir / "seen.json"
            counts: dict[str, int] = {}
            with contextlib.suppress(OSError, ValueError):
                counts = orjson.loads(counts_file.read_bytes())
            counts[base] = counts.get(base, 0) + 1
            counts_file.write_bytes(orjson.dumps(counts))
        return f"{base}.{counts[base]}"

    def tell_driver(self, what: str) -> None:
        with open(self.rundir / "notice", "a", encoding="utf-8") as f:
            f.write(what + "\n")

    # a syscall's params: each method's own, checked by the daemon
    def call(self, method: str, params: dict[str, Any]) -> Any:
        with Connection(self.socket, 60) as conn:
            return conn.call(method, {"token": self.token, "session": self.session, **params})

    # Codex's hook event in, its hook answer out: Codex's JSON formats
    def pre(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """None: the call runs. Otherwise the block to print."""
        tool = str(event.get("tool_name") or "unknown")
        tool_input = event.get("tool_input")
        use_id = str(event.get("tool_use_id") or "")
        key = self.key(tool, tool_input)
        params = {
            "kind": "tool", "name": tool, "ordinal": 1, "key": key, "key_is_id": True,
            "args": tool_input, "risk": codex_risk(tool),
        }  # fmt: skip
        try:
            # the daemon's sdk.step answer, read by key
            answer: dict[str, Any] = self.call("sdk.step", params)
        except (RemoteError, OSError) as exc:
            return deny(f"sessiond could not decide: {exc}")
        status = answer.get("status")
        if status in ("run", "denied", "replayed") and use_id:
            # For the driver (it counts the calls allowed) and for `post`.
            self.calls.mkdir(exist_ok=True)
            tmp = self.calls / f".{use_id}.tmp"
            tmp.write_bytes(orjson.dumps({"call": answer["call"], "key": key, "status": status}))
            tmp.rename(self.calls / f"{use_id}.json")
        if status == "run":
            return None
        if status == "replayed":
            result = orjson.dumps(answer.get("result")).decode()[:2000]
            return deny(
                f"{tool} already ran in this turn (call {answer['call']}); it is not run "
                f"twice. Its result: {result}"
            )
        if status == "denied":
            return deny(f"{tool} was denied by sessiond: {answer.get('rule', '')}")
        if status == "ask":
            self.tell_driver(f"ask {answer['call']} {tool}")
            time.sleep(ASK_HOLD)  # the driver stops the CLI (and this hook) meanwhile
            return deny("a person must answer first; sessiond stopped this run")
        self.tell_driver(f"stop {status}")
        reason = answer.get("reason") or answer.get("rule") or status
        return deny(f"sessiond stops this run: {reason}")

    # Codex's PostToolUse hook event: its JSON format
    def post(self, event: dict[str, Any]) -> None:
        use_id = str(event.get("tool_use_id") or "")
        handed = self.calls / f"{use_id}.json"
        if not use_id or not handed.exists():
            return  # never allowed by `pre`: nothing of ours ran
        began = orjson.loads(handed.read_bytes())
        if began.get("status") != "run":
            return
        response = event.get("tool_response")
        text = response if isinstance(response, str) else orjson.dumps(response).decode()
        tool = str(event.get("tool_name") or "unknown")
        self.call("sdk.step_done", {
            "call": began["call"], "status": "ok", "result": text,
            "observation": f"{tool}: {text[:200]}",
        })  # fmt: skip


def main(argv: list[str]) -> int:
    which = argv[1] if len(argv) > 1 else ""
    try:
        event = orjson.loads(sys.stdin.buffer.read())
        hook = Hook(dict(os.environ))
        if which == "pre":
            verdict = hook.pre(event)
            if verdict is not None:
                sys.stdout.write(orjson.dumps(verdict).decode())
            return 0
        if which == "post":
            hook.post(event)
            return 0
        print(f"sessiond: unknown hook {which!r} (pre or post)", file=sys.stderr)
        return 2
    except Exception as exc:  # fail closed: exit 2 blocks the call, with the reason
        print(f"sessiond's tool hook failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
