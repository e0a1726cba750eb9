"""README.md's "The event log as a library" runs as written (it passed the state
instead of the records to ``messages`` and failed with a TypeError)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_readme_library_example_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The event log as a library", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ready [" in done.stdout, done.stdout
    assert "'hi'" in done.stdout, done.stdout
    assert (tmp_path / "state" / "sessions" / "hello" / "events.jsonl").is_file()
