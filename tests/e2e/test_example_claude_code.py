"""examples/claude-code runs offline as its README says (`make example-claude-code`
runs this script): the real CLI and daemon, the model scripted on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_claude_code import CLI

pytestmark = pytest.mark.timeout(400)

SCRIPT = Path(__file__).parents[2] / "examples" / "claude-code" / "offline.py"


def test_the_offline_tour_asks_before_writing_and_writes_once() -> None:
    assert CLI.exists()  # else test_claude_code skipped the module with the reason
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=380, check=False
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "approval pending for Write" in out
    assert "Release 2.4: API freeze Feb 24" in out
    assert "Write [r1.2] ask: rule ask 'Write'" in out
    assert "Read [r1.1] allow: rule allow 'Read'" in out
    assert "cost=$" in out
    assert "The model answered 4 requests." in out  # nothing asked twice
    # the end state the README shows: asleep for the next message, after two runs
    end = out.split("$ sessionctl show claude-code")[-1]
    assert "state: sleeping" in end
    assert "runs: 2" in end
