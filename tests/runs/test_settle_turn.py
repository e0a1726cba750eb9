"""Which run ends its turn (sessiond/runs/settle.py, ``Settler._ends_turn``).

Found by the kill -9 campaign: an unsafe command exited 0 just as the daemon shut
down; its run was recorded ``ok`` with the turn left open, and the restart's
follow-up ran the whole command again. A command is its turn's one step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from sessiond.runs.settle import Settler


def ends_turn(kind: str, status: str, stop: str | None) -> bool:
    session = SimpleNamespace(
        spec=SimpleNamespace(run=SimpleNamespace(kind=kind)),
        run=SimpleNamespace(stop_requested=stop),
        journal=SimpleNamespace(state=SimpleNamespace(pending_approvals=list, in_flight=list)),
    )
    settler = cast(Any, object.__new__(Settler))
    settler.tokens = SimpleNamespace(grant_of=lambda _s: None)
    return bool(settler._ends_turn(session, SimpleNamespace(status=status)))


@pytest.mark.parametrize("stop", [None, "shutdown", "interrupt"])
def test_a_command_that_exited_0_ends_its_turn_whatever_stop_raced_it(stop: str | None) -> None:
    assert ends_turn("command", "ok", stop)


def test_a_command_that_did_not_exit_0_leaves_its_turn_open() -> None:
    assert not ends_turn("command", "interrupted", "shutdown")
    assert not ends_turn("command", "failed", None)


def test_an_sdk_program_stopped_at_a_stable_point_leaves_its_turn_open() -> None:
    assert not ends_turn("sdk", "ok", "shutdown")
    assert ends_turn("sdk", "ok", None)
