"""Shared fixtures. Hypothesis runs a bounded profile in `make test` ("ci", the
default) and a longer one locally with HYPOTHESIS_PROFILE=long."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.patience import SLOW

# The hostile tests' shared checks (serving, refused, ...) assert: rewritten like a
# test module's, their failures show the values. Registered here, at the root,
# because tests outside tests/faults import them too (before that conftest loads).
pytest.register_assert_rewrite("tests.faults.hostile")

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


# `make check` (the fast loop) runs what starts no process: `-m "not process"`.
# A test is `process` when it lives where every test starts real processes (the
# daemon, PostgreSQL, the campaigns) or is named below; tests/inproc is the
# in-process daemon (tests/inproc/harness.py), marked `inproc`.
PROCESS_DIRS = frozenset({"e2e", "cluster", "faults", "integrations"})
PROCESS_FILES = frozenset({"test_bench.py", "test_pgwatch.py", "test_demo.py"})
# a module that starts the real daemon through the e2e harness, wherever it lives
# (tests/gateway's end-to-end tests use it through tests/gateway/rig.py)
PROCESS_IMPORTS = ("tests.e2e.harness", "tests.gateway.rig")
PROCESS_TESTS = frozenset({"test_cron_jitter_is_the_same_in_every_process"})
TESTS = Path(__file__).parent


@functools.cache
def _starts_daemons(path: Path) -> bool:
    return path.suffix == ".py" and any(name in path.read_text() for name in PROCESS_IMPORTS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test's hang bound (pytest-timeout: pyproject's `timeout`, or the test's
    # own mark) grows with the machine's load, as the tests' other allowances do
    # (tests/patience.py, SLOW): two suites at once on 2 cores made good tests
    # run past a bound set for one.
    default = float(config.getini("timeout") or 0)
    for item in items:
        mark = item.get_closest_marker("timeout")
        bound = float(mark.args[0]) if mark is not None and mark.args else default
        if bound > 0 and SLOW != 1:
            item.add_marker(pytest.mark.timeout(bound * SLOW), append=False)
        parts = item.path.relative_to(TESTS).parts
        params = getattr(item, "callspec", None)
        if (
            parts[0] in PROCESS_DIRS
            or parts[-1] in PROCESS_FILES
            or _starts_daemons(item.path)
            or getattr(item, "originalname", item.name) in PROCESS_TESTS
            or "pg_dsn" in getattr(item, "fixturenames", ())
            or (params is not None and "postgres" in params.params.values())
        ):
            item.add_marker(pytest.mark.process)
        elif parts[0] == "inproc":
            item.add_marker(pytest.mark.inproc)


# A real PostgreSQL, started once per run (tests/pgserver.py).
from tests.pgserver import pg_dsn, postgres  # noqa: E402, F401
