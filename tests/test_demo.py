"""`make run`'s demo, run as a process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_the_demo_writes_repairs_replays_and_checks_a_session(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "sessiond.demo", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = done.stdout
    assert "wrote 17 events" in out
    assert "replayed from the snapshot at seq 10, now at seq 18" in out
    assert "39 bytes dropped" in out
    assert '"state": "sleeping"' in out
    assert "tool: 3 employees, 14250.00" in out
    assert "imported as payroll-copy at seq 20" in out
    assert "3 sessions, 49 events, problems: 0" in out
    assert (state / "sessions" / "payroll" / "events.jsonl").is_file()


def test_the_demo_prints_only_its_tour_and_no_log_lines(tmp_path: Path) -> None:
    """It printed 17 debug lines of the store (``log.commit`` for each write) and a
    warning that repeated its own words about the repair."""
    done = subprocess.run(
        [sys.executable, "-m", "sessiond.demo", "--state-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stderr == ""
    # a structlog line, on a terminal ("2026-12-06 07:46:24 [debug    ] ...") or as JSON
    noise = re.compile(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[|"event":|log\.commit')
    assert [line for line in done.stdout.splitlines() if noise.search(line)] == []
    assert "repairs: last line has no newline (torn write), 39 bytes dropped" in done.stdout
