"""What a test runs as another user is readable by that user wherever the clone lives.

`make test` in a fresh clone under a folder closed to others (mode 0700, as
``mktemp -d`` makes, and as many home folders are) failed: a program run as
``nobody`` straight from the checkout could not be opened. The harness copies
such programs to a folder any uid can read (``readable_by_others``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import closed_to_others, readable_by_others, short_dir

NOBODY = 65534


def as_nobody(program: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/usr/bin/python3", "-I", str(program)],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_program_in_a_closed_folder_is_run_by_another_uid_from_its_copy() -> None:
    if os.geteuid() != 0:
        pytest.skip("running a program as another uid needs root")
    closed = short_dir()  # 0700, as mktemp -d makes it: a clone's parent folder
    try:
        program = closed / "checkout" / "prog.py"
        program.parent.mkdir()
        program.write_text("import os\nprint('ran as', os.getuid())\n")
        assert closed_to_others(program) == closed
        assert "Permission denied" in as_nobody(program).stderr  # the bug, as nobody saw it
        with readable_by_others(program) as (copy,):
            assert closed_to_others(copy) is None
            done = as_nobody(copy)
            assert (done.returncode, done.stdout) == (0, f"ran as {NOBODY}\n"), done.stderr
        assert not copy.parent.exists()  # removed at the end
    finally:
        shutil.rmtree(closed, ignore_errors=True)


def test_closed_to_others_names_the_first_folder_others_cannot_search() -> None:
    top = short_dir()  # under /tmp, which others may search
    try:
        inner = top / "outer" / "inner"
        inner.mkdir(parents=True)
        os.chmod(top, 0o755)
        os.chmod(top / "outer", 0o700)
        assert closed_to_others(inner / "f.py") == top / "outer"
        assert closed_to_others(top / "outer") == top / "outer"  # a folder: itself too
        os.chmod(top / "outer", 0o711)  # searchable is enough
        assert closed_to_others(inner / "f.py") is None
        os.chmod(inner, 0o700)
        assert closed_to_others(inner) == inner
    finally:
        shutil.rmtree(top, ignore_errors=True)
