"""What a run of an agent CLI kind (``kind = "claude-code"``) gets besides a
program's environment: its settings, and a private home that lasts from run to
run (the CLI's config, its session transcripts), owner-only, under the state dir.

A private ``HOME`` and ``CLAUDE_CONFIG_DIR`` mean no user's or workspace's
settings can allow a tool the session's policy did not (docs/agents.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from sessiond.table.spec import SessionSpec


def agent_home(state_dir: Path, session: str) -> Path:
    return state_dir / "agents" / session


def agent_env(spec: SessionSpec, state_dir: Path, session: str) -> dict[str, str]:
    """SESSIOND_CLAUDE_CODE (the [claude_code] table and the policy's deny list, as
    JSON) and SESSIOND_AGENT_HOME; nothing for other kinds."""
    if spec.run is None or spec.run.kind != "claude-code":
        return {}
    home = agent_home(state_dir, session)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    settings = spec.claude_code.model_dump(mode="json") if spec.claude_code else {}
    settings["deny"] = list(spec.policy.deny)
    return {
        "SESSIOND_CLAUDE_CODE": orjson.dumps(settings).decode(),
        "SESSIOND_AGENT_HOME": str(home),
    }
