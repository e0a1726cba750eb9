"""A wake waits for one commit before its program runs (files backend)."""

from __future__ import annotations

from tests.e2e.harness import running
from tests.e2e.wakecommits import activate_and_count, send_and_count

DEBUG = 'log_level = "debug"\n'


def test_a_message_wake_waits_for_one_commit_before_the_program_runs() -> None:
    with running(DEBUG) as d:
        commits = send_and_count(d, "m")
        assert len(commits) == 1, commits


def test_an_activate_waits_for_one_commit_before_the_program_runs() -> None:
    with running(DEBUG) as d:
        commits = activate_and_count(d, "a")
        assert len(commits) == 1, commits
