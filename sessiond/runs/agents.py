"""What a run of an agent CLI kind (``kind = "claude-code"`` or ``"codex"``) gets
besides a program's environment: its settings, and a private home that lasts from
run to run (the CLI's config, its session transcripts), owner-only, under the
state dir.

A private ``HOME`` and ``CLAUDE_CONFIG_DIR`` / ``CODEX_HOME`` mean no user's or
workspace's settings can allow a tool the session's policy did not
(docs/agents.md).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import orjson

from sessiond.log.store.base import Store
from sessiond.table.spec import SessionSpec


def agent_home(state_dir: Path, session: str) -> Path:
    return state_dir / "agents" / session


AGENT_KINDS = frozenset({"claude-code", "codex"})


def agent_env(spec: SessionSpec, state_dir: Path, session: str) -> dict[str, str]:
    """SESSIOND_CLAUDE_CODE (the [claude_code] table and the policy's deny list, as
    JSON) or SESSIOND_CODEX (the [codex] table), and SESSIOND_AGENT_HOME; nothing
    for other kinds."""
    if spec.run is None or spec.run.kind not in AGENT_KINDS:
        return {}
    home = agent_home(state_dir, session)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    if spec.run.kind == "codex":
        table = spec.codex.model_dump(mode="json") if spec.codex else {}
        return {"SESSIOND_CODEX": orjson.dumps(table).decode(), "SESSIOND_AGENT_HOME": str(home)}
    settings = spec.claude_code.model_dump(mode="json") if spec.claude_code else {}
    settings["deny"] = list(spec.policy.deny)
    return {
        "SESSIOND_CLAUDE_CODE": orjson.dumps(settings).decode(),
        "SESSIOND_AGENT_HOME": str(home),
    }


# The step a claude-code run stores its CLI transcript with (sessiond.integrations.claude_code),
# and a codex run its thread's rollout (sessiond.integrations.codex).
TRANSCRIPT_TOOL = "claude-code.transcript"
CODEX_TRANSCRIPT_TOOL = "codex.transcript"
# kind -> (its step, the CLI's folder in the home, the id's key in the step's args,
# the file the driver reads the id to resume from, the path's form: parts, first part)
_TRANSCRIPTS = {
    "claude-code": (TRANSCRIPT_TOOL, ".claude", "session_id", "session-id", 3, "projects"),
    "codex": (CODEX_TRANSCRIPT_TOOL, ".codex", "thread_id", "thread-id", 5, "sessions"),
}


def _transcript_path(args: object, parts: int = 3, first: str = "projects") -> PurePosixPath | None:
    """Where under the CLI's folder the transcript goes: projects/DIR/ID.jsonl only
    (Claude Code), sessions/YYYY/MM/DD/rollout-….jsonl only (Codex)."""
    path = args.get("path") if isinstance(args, dict) else None
    if not isinstance(path, str):
        return None
    p = PurePosixPath(path)
    ok = len(p.parts) == parts and p.parts[0] == first and p.suffix == ".jsonl"
    return p if ok and ".." not in p.parts and not p.is_absolute() else None


def restore_transcript(
    store: Store, state_dir: Path, session: str, kind: str = "claude-code"
) -> str | None:
    """Put the last CLI transcript the session's log holds (a fork's: the parent's
    up to the fork) in the session's private home, so its next run resumes it.
    Returns the CLI session (or thread) id restored, or None."""
    if kind not in _TRANSCRIPTS:
        return None
    tool, folder, id_key, id_file, parts, first = _TRANSCRIPTS[kind]
    args: dict[str, object] = {}
    last: tuple[object, str] | None = None
    for rec in store.read(session):
        data = rec["data"]
        if data.get("tool") != tool:
            continue
        if rec["type"] == "tool.intent":
            args[data["call"]] = data.get("args")
        elif rec["type"] == "tool.finished" and data.get("status") == "ok":
            ref = data.get("result_ref")
            if isinstance(ref, dict) and data["call"] in args:
                last = (args[data["call"]], ref["ref"])
    if last is None:
        return None
    where = _transcript_path(last[0], parts, first)
    sid = last[0].get(id_key) if isinstance(last[0], dict) else None
    if where is None or not isinstance(sid, str) or not sid:
        return None
    home = agent_home(state_dir, session)
    target = home / folder / where
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    target.write_bytes(store.artifacts(session).get(last[1]))
    (home / id_file).write_text(sid)
    return sid
