"""The cluster tests' two leases (conftest.py): a node a test lets lapse has the
short one, scaled by the load factor; every other node the long one, so that a
renewal a busy machine delays never ends a node the test relies on. (With one
2 s lease for all, two suites at once on 2 cores ended the node that was to take
over: tests/cluster/test_silent_db.py waited for a take-over that never came.)"""

from __future__ import annotations

import re
import shutil

import pytest

from sessiond.config import load_config
from tests.cluster.conftest import KEPT_TTL, TTL, nodes_of, short_leased
from tests.patience import SLOW


def ttl_of(text: str) -> float:
    found = re.search(r'^lease_ttl = "([0-9.]+)s"$', text, re.MULTILINE)
    assert found is not None, text
    return float(found.group(1))


@pytest.mark.short_lease("n2")
def test_only_the_nodes_a_test_lets_lapse_have_the_short_lease(
    request: pytest.FixtureRequest,
) -> None:
    assert TTL == 2.0 * SLOW
    assert KEPT_TTL >= 10 * 2.0  # a renewal may be seconds late and not lapse it
    short = short_leased(request)
    assert short == ("n2",)
    with nodes_of("postgresql://sessiond@/sessiond", 3, start=False, short=short) as made:
        ttls = [ttl_of(d.config.read_text()) for d in made]
        # the daemon reads it so (and would refuse what it cannot)
        config = load_config(made[1].config, env={})
    assert ttls == [KEPT_TTL, TTL, KEPT_TTL]
    assert config.cluster.lease_ttl == TTL
    for d in made:
        shutil.rmtree(d.root, ignore_errors=True)
