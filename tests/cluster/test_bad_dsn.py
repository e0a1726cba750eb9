"""A node or ``fsck --dsn`` given a DSN that cannot work says what is wrong at
once, in its last line (the database's own reason), not after half a minute of
a connection pool's retries ending in "pool initialization incomplete".
Real PostgreSQL, the real commands."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sessiond.localpg import LocalPostgres
from tests.e2e.harness import SESSIOND, short_dir


def _last_line(argv: list[str]) -> tuple[int, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    lines = done.stderr.strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("{missing}", 'database "nosuchdb" does not exist'),
        ("garbage", 'missing "=" after "garbage"'),
        ("{nowhere}", "No such file or directory"),
    ],
)
def test_a_node_with_a_dsn_that_cannot_work_names_the_reason(
    postgres: LocalPostgres, dsn: str, says: str
) -> None:
    dsn = dsn.format(
        missing=postgres.dsn_for("nosuchdb"),
        nowhere=postgres.dsn_for("x").replace("sock", "nowhere"),
    )
    root = short_dir()
    try:
        (root / "c.toml").write_text(f'[cluster]\ndsn = "{dsn}"\nnode = "bad"\n')
        code, last = _last_line(
            [
                SESSIOND,
                "--config",
                str(root / "c.toml"),
                "--state-dir",
                str(root / "state"),
                "--socket",
                str(root / "s.sock"),
            ]
        )
        assert code != 0
        assert says in last, last
        assert "cluster's database" in last, last

        code, last = _last_line([SESSIOND, "fsck", "--dsn", dsn])
        assert code != 0
        assert says in last, last
    finally:
        shutil.rmtree(root, ignore_errors=True)
