"""No provider key ever enters a run: a program in a real sandbox calls models
through the gateway, then dumps its environment, /proc as it sees it, and every
file it can read, and finds neither key. With ``network = "none"`` the same
program reaches the gateway at the same address, through the relay in its
sandbox, and nothing else."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.e2e.harness import wait_event
from tests.gateway.rig import ANTHROPIC_KEY, OPENAI_KEY, gateway, session

HUNTER = Path(__file__).parent / "programs" / "keyhunt.py"
KNOCK = Path(__file__).parent / "programs" / "knock.py"


@pytest.mark.parametrize("network", ["host", "none"])
@pytest.mark.timeout(600)
def test_a_program_finds_no_provider_key_anywhere_it_can_look(network: str) -> None:
    # the daemon's own environment holds one key, under its name and under another
    # (a person's shell), and the other key is in a file anyone may read: the run
    # still sees neither
    # (out of /tmp, which every sandbox has private: only the boundary hides it)
    env = {"ANTHROPIC_API_KEY": ANTHROPIC_KEY, "SOME_TOOL_TOKEN": OPENAI_KEY}
    key_dir = Path(tempfile.mkdtemp(prefix="sd-key-", dir="/var/tmp"))
    key_dir.chmod(0o755)
    try:
        look(network, env, key_dir)
    finally:
        shutil.rmtree(key_dir)


def look(network: str, env: dict[str, str], key_dir: Path) -> None:
    with gateway(env=env, key_dir=key_dir) as (d, up):
        key_file = key_dir / "openai.key"
        key_file.chmod(0o644)
        cwd = session(d, "hunter", [], program=HUNTER, network=network)
        # what a run is given on purpose (a decoy in its workspace) is found: the
        # hunt works, and finds nothing else
        (cwd / "decoy.txt").write_text(f"planted: {ANTHROPIC_KEY}\n")
        prefix = "sk-gwtest-"
        assert ANTHROPIC_KEY.startswith(prefix)
        assert OPENAI_KEY.startswith(prefix)
        keys = {hashlib.sha256(k.encode()).hexdigest(): len(k) for k in (ANTHROPIC_KEY, OPENAI_KEY)}
        # every file it can read, on the host network; a network of its own changes
        # no file it sees: there its workspace, home, /etc, /var, /run and /tmp
        walk = ["/"] if network == "host" else [str(cwd), "/etc", "/var", "/run", "/tmp", "/root"]
        hunt = {"prefix_reversed": prefix[::-1], "keys": keys, "walk": walk}
        (cwd / "hunt.json").write_text(json.dumps(hunt))
        d.ctl("activate", "hunter", check=True)
        finished = wait_event(d, "hunter", "run.finished", timeout=500)
        out = cwd / "hunt.out.json"
        assert out.exists(), (finished, d.ctl("output", "hunter").stdout[-3000:])
        report = json.loads(out.read_text())
        # it reached the models through the gateway (and the keys went upstream)
        assert report["anthropic"] == "echo: key?"
        assert report["openai"] == "echo: key?"
        assert up.keys == [ANTHROPIC_KEY, OPENAI_KEY]
        # it looked, and found nothing
        assert report["files"] > (100_000 if network == "host" else 10)
        assert report["proc_files"] > 20
        assert report["found"] == [str(cwd / "decoy.txt")]


@pytest.mark.parametrize(("allow", "expected"), [([], "closed"), (["claude-*"], "open")])
def test_a_run_without_a_network_reaches_the_gateway_only_where_it_may_call_models(
    allow: list[str], expected: str
) -> None:
    with gateway() as (d, _up):
        cwd = session(d, "knock", [], program=KNOCK, network="none", allow=allow)
        d.ctl("activate", "knock", check=True)
        wait_event(d, "knock", "run.finished", timeout=60)
        assert (cwd / "knock.txt").read_text() == expected
