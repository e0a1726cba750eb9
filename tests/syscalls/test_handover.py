"""The hand-over's rules that need no daemon: the lifecycle of an arriving copy, the
fold of the hand-over's events, and what an operator's resolve may do given the
source's answer. (The daemons themselves: tests/e2e/test_migrate.py.)"""

from __future__ import annotations

import pytest

from sessiond.errors import Refused
from sessiond.log.event_data import (
    LifecycleChanged,
    MigrationArriving,
    MigrationFinished,
    MigrationStarted,
    SessionMigrated,
)
from sessiond.log.events import CURRENT_VERSION
from sessiond.log.replay import replay_all
from sessiond.log.store.base import Record
from sessiond.syscalls.handover import judge
from sessiond.table import lifecycle

H = "ab" * 16


def test_only_the_hand_over_moves_an_arriving_session() -> None:
    for why in ("activate", "suspend", "cancel", "resolve"):
        with pytest.raises(lifecycle.IllegalTransition, match="resolve s --accept"):
            lifecycle.check("s", "arriving", "sleeping", why)
    lifecycle.check("s", "arriving", "sleeping", "arrive")
    with pytest.raises(lifecycle.IllegalTransition):
        lifecycle.check("s", "arriving", "running", "arrive")  # it arrives not running
    assert "arriving" in lifecycle.STATES


def _record(seq: int, data: object) -> Record:
    etype = data.EVENT_TYPE  # type: ignore[attr-defined]
    return {
        "v": CURRENT_VERSION[etype],
        "session": "s",
        "seq": seq,
        "id": f"{seq:032x}",
        "ts": "2026-12-02T00:00:00Z",
        "type": etype,
        "causation": None,
        "correlation": None,
        "data": data.model_dump(mode="json", by_alias=True),  # type: ignore[attr-defined]
    }


def test_the_fold_keeps_each_side_of_the_hand_over() -> None:
    source = replay_all(
        "s",
        [
            _record(1, MigrationStarted(handover=H, to="/t.sock")),
            _record(2, SessionMigrated(to="/t.sock", handover=H)),
        ],
    )
    assert source.handover == {"id": H, "role": "source", "peer": "/t.sock", "phase": "committed"}
    arriving = LifecycleChanged.model_validate({"from": "sleeping", "to": "arriving"})
    target = replay_all(
        "s",
        [
            _record(1, MigrationStarted(handover=H, to="/t.sock")),  # from the bundle
            _record(2, MigrationArriving(handover=H, source="/s.sock", restore="sleeping")),
            _record(3, arriving),
            _record(4, MigrationFinished(handover=H)),
        ],
    )
    assert target.handover == {
        "id": H,
        "role": "target",
        "peer": "/s.sock",
        "phase": "finished",
        "restore": "sleeping",
    }
    assert target.state == "arriving"  # the lifecycle change follows the finish


@pytest.mark.parametrize(
    ("option", "said", "action"),
    [
        ("accept", "committed", "finish"),
        ("accept", None, "finish"),  # the source is gone: the operator decides
        ("accept", "unknown", "finish"),
        ("discard", "aborted", "discard"),
        ("discard", None, "discard"),
        ("discard", "unknown", "discard"),
    ],
)
def test_resolve_of_an_arriving_copy_follows_the_source_when_it_answers(
    option: str, said: str | None, action: str
) -> None:
    assert judge("s", "/s.sock", option, said) == action


@pytest.mark.parametrize(
    ("option", "said", "words"),
    [
        ("discard", "committed", "the only live one"),  # it would leave none
        ("accept", "aborted", "its copy there is the live one"),  # it would leave two
        ("accept", "pending", "right now"),
        ("discard", "pending", "right now"),
        ("rerun", None, "no step to run again"),
    ],
)
def test_resolve_of_an_arriving_copy_is_refused_where_the_source_says_otherwise(
    option: str, said: str | None, words: str
) -> None:
    with pytest.raises(Refused, match=words):
        judge("s", "/s.sock", option, said)
