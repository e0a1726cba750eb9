"""Every daemon a test starts ends with the test, even when the test fails
before its own clean-up: a leaked daemon would keep its state and CPU for the
rest of the run (and past it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import LIVE


@pytest.fixture(autouse=True)
def _reap_daemons() -> Iterator[None]:
    yield
    leaked = [d for d in list(LIVE) if d.reap()]
    if leaked:
        # A passing test that forgets its daemon is a defect in the test: say so.
        roots = ", ".join(str(d.root) for d in leaked)
        pytest.fail(f"the test left {len(leaked)} daemon(s) running: {roots}", pytrace=False)
