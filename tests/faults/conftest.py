"""The fault tests start real daemons: the e2e suite's reaper ends each one with
its test (imported, not copied, so both suites reap the same way)."""

from __future__ import annotations

from tests.e2e.conftest import _reap_daemons

__all__ = ["_reap_daemons"]
