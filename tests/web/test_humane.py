"""The console's words for times and its buttons (sessiond.web.humane), and the
error pages' text (sessiond.web.pages): unit tests of the logic the pages use."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from sessiond.table.lifecycle import STATES, TRANSITIONS, IllegalTransition, check
from sessiond.web.humane import actions_for, duration, relative, time_tag, wake_tag
from sessiond.web.pages import ERRORS, ticks

NOW = dt.datetime(2026, 12, 6, 7, 34, 18, tzinfo=dt.UTC)
# what each action asks of the transition table (the syscall's own refusals aside)
TARGET = {"activate": "ready", "suspend": "suspended", "resume": "sleeping",
          "interrupt": "sleeping", "cancel": "terminated"}  # fmt: skip


@pytest.mark.parametrize("state", STATES)
def test_every_offered_action_is_a_transition_the_table_allows(state: str) -> None:
    offered = actions_for(state)
    allowed = []
    for action in offered:
        check("s", state, TARGET[action], action)  # raises IllegalTransition if not
        allowed.append(action)
    assert allowed == offered


def test_a_terminated_or_arriving_session_offers_no_action() -> None:
    assert actions_for("terminated") == []
    assert actions_for("arriving") == []
    with pytest.raises(IllegalTransition):
        check("s", "terminated", "suspended", "suspend")


def test_each_state_offers_exactly_what_would_change_it() -> None:
    assert actions_for("created") == ["activate", "suspend", "cancel"]
    assert actions_for("running") == ["suspend", "interrupt", "cancel"]
    assert actions_for("sleeping") == ["activate", "suspend", "cancel"]
    assert actions_for("suspended") == ["resume", "cancel"]
    assert actions_for("blocked") == ["suspend", "cancel"]  # recovery is the gate's
    assert set(TRANSITIONS) == set(STATES)
    # a session with no [run] program has nothing to activate (the syscall refuses it)
    assert actions_for("created", runnable=False) == ["suspend", "cancel"]
    assert actions_for("sleeping", runnable=False) == ["suspend", "cancel"]


def test_times_read_relative_to_now() -> None:
    assert relative(NOW - dt.timedelta(minutes=3, seconds=20), NOW) == "3 min ago"
    assert relative(NOW + dt.timedelta(minutes=52), NOW) == "in 52 min"
    assert relative(NOW, NOW) == "just now"
    assert relative(NOW - dt.timedelta(hours=2, minutes=5), NOW) == "2 h 5 min ago"
    assert relative(NOW - dt.timedelta(days=3), NOW) == "3 d ago"
    assert duration(0.042) == "42 ms"
    assert duration(2.5) == "2.5 s"
    assert duration(12.9) == "12 s"


def test_a_time_tag_has_the_exact_time_on_hover_and_no_microseconds() -> None:
    tag = str(time_tag("2026-12-06T07:31:00.123456Z", NOW))
    assert ">3 min ago</time>" in tag
    assert 'title="2026-12-06 07:31:00 UTC"' in tag
    assert not re.search(r">[^<]*\.\d{6}", tag)  # none in what a person reads
    assert str(time_tag(None, NOW)) == "—"
    assert str(time_tag("<b>", NOW)) == "&lt;b&gt;"  # not a time: escaped as it is


def test_error_pages_have_their_own_heading_and_no_raw_backticks() -> None:
    assert ERRORS[401][0] != ERRORS[409][0]
    assert len({heading for heading, _ in ERRORS.values()}) == len(ERRORS)  # each its own
    assert "Not here" not in {heading for heading, _ in ERRORS.values()}
    shown = str(ticks("run `sessionctl web` & open <it>"))
    assert shown == "run <code>sessionctl web</code> &amp; open &lt;it&gt;"
    assert "`" not in str(ticks(ERRORS[401][1]))


def test_a_next_wake_reads_its_time_relative_and_keeps_the_rest() -> None:
    tag = str(wake_tag("2026-12-06T08:00:00Z; on message", NOW))
    assert tag.startswith('<time class="rel"')
    assert ">in 25 min</time>; on message" in tag
    assert str(wake_tag("on change of a.txt", NOW)) == "on change of a.txt"
    assert str(wake_tag(None, NOW)) == "—"
