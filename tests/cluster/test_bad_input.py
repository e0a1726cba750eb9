"""Bad input to the cluster's commands, against a real PostgreSQL and real nodes.

A node or ``fsck --dsn`` given a DSN that cannot work says what is wrong at
once, in its last line (the database's own reason), not after half a minute of
a connection pool's retries ending in "pool initialization incomplete";
``migrate --node`` and ``drain`` name what is wrong with a node name."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sessiond.errors import InvalidInput
from sessiond.localpg import LocalPostgres
from tests.cluster.conftest import HELLO, SHARED
from tests.e2e.harness import SESSIOND, Daemon, short_dir


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


def test_migrate_and_drain_name_what_is_wrong_with_a_node(pg_dsn: str) -> None:
    node = Daemon(short_dir(), f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n1"\n{SHARED}')
    try:
        node.start()
        node.ctl("create", str(node.write_spec("hello", HELLO)), check=True)
        # its own node: not "not a live node" (it is), but where it runs already
        same = node.ctl("migrate", "hello", "--node", "n1")
        assert same.returncode == 1
        assert "runs on node 'n1' already" in same.stderr
        # a name no node can have: said so, briefly, whatever its length
        for args in (["migrate", "hello", "--node"], ["drain"]):
            bad = node.ctl(*args, "x" * 5000)
            assert bad.returncode == InvalidInput.exit_code, bad.stderr
            assert "is not a node name" in bad.stderr
            assert len(bad.stderr) < 300
        # --force for a session no node has: said so, as everywhere else
        none = node.ctl("migrate", "nope", "--node", "n1", "--force")
        assert none.returncode == 4, none.stderr
        assert "no session 'nope'" in none.stderr, none.stderr
        assert node.ctl("ping").returncode == 0
    finally:
        node.reap()
        shutil.rmtree(node.root, ignore_errors=True)
