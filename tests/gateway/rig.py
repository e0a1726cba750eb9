"""A daemon with the model gateway in front of a scripted upstream, and a session
whose program calls models through it (programs/gwclient.py)."""

from __future__ import annotations

import json
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sessiond.gateway.scripted import Reply, Upstream
from tests.e2e.harness import Daemon, short_dir

CLIENT = Path(__file__).parent / "programs" / "gwclient.py"
# new for every test process: found anywhere, they came from here
ANTHROPIC_KEY = f"sk-gwtest-anthropic-{secrets.token_hex(16)}"
OPENAI_KEY = f"sk-gwtest-openai-{secrets.token_hex(16)}"

PROVIDERS = """
[[model.provider]]
name = "anthropic-test"
kind = "anthropic"
base_url = "{url}"
key_env = "GW_TEST_ANTHROPIC_KEY"
models = ["claude-*"]
price_in = 3.0
price_out = 15.0

[[model.provider]]
name = "openai-test"
kind = "openai"
base_url = "{url}/v1"
key_file = "{key_file}"
models = ["gpt-*", "o4-*"]
"""

SPEC = """name = "{name}"
goal = "call models"
[run]
kind = "sdk"
exec = ["{python}", "{client}"]
cwd = "{cwd}"
retries = {retries}
network = "{network}"
env = {{ GW_FAIL_ONCE = "{fail_once}" }}
[model]
allow = {allow}
strict = {strict}
"""


@contextmanager
def gateway(
    script: list[Reply] | None = None,
    config: str = "",
    *,
    env: dict[str, str] | None = None,
    key_dir: Path | None = None,
    **limits: Any,
) -> Iterator[tuple[Daemon, Upstream]]:
    """A scripted upstream and a daemon whose providers point at it (the OpenAI key in
    a file: in ``key_dir``, else the daemon's folder)."""
    root = short_dir()
    key_file = (key_dir or root) / "openai.key"
    key_file.write_text(OPENAI_KEY + "\n")
    key_file.chmod(0o600)
    with Upstream(script, **limits) as up:
        text = PROVIDERS.format(url=up.url, key_file=key_file) + config
        d = Daemon(root, text, env={"GW_TEST_ANTHROPIC_KEY": ANTHROPIC_KEY, **(env or {})})
        try:
            yield d.start(), up
        finally:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
            shutil.rmtree(root, ignore_errors=True)


def session(
    d: Daemon,
    name: str,
    plan: list[dict[str, Any]] | dict[str, Any],
    *,
    allow: list[str] | None = None,
    retries: int = 0,
    network: str = "host",
    fail_once: bool = False,
    strict: bool = False,
    program: Path = CLIENT,
) -> Path:
    """A session running ``program`` with ``plan``; its working folder."""
    cwd = d.root / f"ws-{name}"
    cwd.mkdir()
    cwd.chmod(0o777)  # the run's uid writes its results here
    (cwd / "plan.json").write_text(json.dumps(plan))
    text = SPEC.format(
        name=name, python=sys.executable, client=program, cwd=cwd, retries=retries,
        network=network, fail_once="1" if fail_once else "",
        allow=json.dumps(allow if allow is not None else ["claude-*", "gpt-*"]),
        strict="true" if strict else "false",
    )  # fmt: skip
    d.ctl("create", str(d.write_spec(name, text)), check=True)
    return cwd


def results(cwd: Path) -> list[dict[str, Any]]:
    path = cwd / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
