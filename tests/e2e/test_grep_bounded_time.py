"""Attack: a timeline filter whose single match takes polynomial time.

The daemon matches ``--grep`` (and the console's timeline ``grep``) in its own
loop; one ``re.search`` cannot be interrupted. The nested-repetition check
refused ``(a+)+`` but not ``.*.*.*.*!``: adjacent repetitions backtrack in
O(n^k) on an event of n characters, so one request held the daemon (and every
session) for minutes. Such a pattern must be refused, or matched in bounded
time, and the daemon must keep answering meanwhile."""

from __future__ import annotations

import pytest

from tests.e2e.harness import running
from tests.e2e.webclient import WEB, logged_in

LONG = "a" * 3000  # one event of a few KB: a message, a command's output


@pytest.mark.parametrize("pattern", [".*.*.*.*!", r"\w*\w*\w*\w*\w*!", "a*a*a*a*a*a*!"])
def test_a_polynomial_grep_does_not_hold_the_daemon(pattern: str) -> None:
    with running(WEB) as d:
        d.ctl("create", str(d.write_spec("s", 'name = "s"\n')), check=True)
        d.ctl("send", "s", LONG, check=True)
        done = d.ctl("log", "s", "--grep", pattern, timeout=20)
        assert done.returncode != 0 or done.stdout == ""  # refused, or nothing matched
        client = logged_in(d)
        answer = client.get(f"/api/s/s/events?grep={pattern}")
        assert answer.status in (200, 400)
        assert d.ctl("ping", timeout=10).returncode == 0
