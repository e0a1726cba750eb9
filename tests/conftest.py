"""Shared fixtures. Hypothesis runs a bounded profile in `make test` ("ci", the
default) and a longer one locally with HYPOTHESIS_PROFILE=long."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

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


# A real PostgreSQL, started once per run (tests/pgserver.py).
from tests.pgserver import pg_dsn, postgres  # noqa: E402, F401
