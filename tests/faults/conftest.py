"""The fault tests start real daemons: reap them as the end-to-end tests do."""

from tests.e2e.conftest import _reap_daemons

__all__ = ["_reap_daemons"]
