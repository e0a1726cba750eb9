"""The fault tests start real daemons: the e2e suite's reaper ends each one with
its test (imported, not copied, so both suites reap the same way)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import _reap_daemons

# The hostile tests' shared checks (serving, refused, ...) assert: rewritten like
# a test module's, their failures show the values, as when they lived in one.
pytest.register_assert_rewrite("tests.faults.hostile")

__all__ = ["_reap_daemons"]
