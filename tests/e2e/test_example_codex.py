"""examples/codex runs offline as its README says (`make example-codex` runs this
script): the real CLI and daemon, the model calls through the gateway to the
scripted upstream."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_codex import CLI

pytestmark = pytest.mark.timeout(400)

SCRIPT = Path(__file__).parents[2] / "examples" / "codex" / "offline.py"


def test_the_offline_tour_asks_before_the_command_and_runs_it_once() -> None:
    assert CLI.exists()  # else test_codex skipped the module with the reason
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=380, check=False
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "approval pending for Bash" in out
    assert "Release 2.4: API freeze Feb 24" in out
    assert "Bash [r1.1] ask: rule ask 'Bash'" in out
    # the gateway's records: each call once, with its cost at the configured prices
    assert out.count("model.responded        gpt-6.1-sol ok") == 3
    assert "The upstream answered 3 requests" in out
    end = out.split("$ sessionctl show codex")[-1]
    assert "state: sleeping" in end
    assert "runs: 2" in end
