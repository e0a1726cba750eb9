"""Where an agent CLI's call stands in its turn (gateway.calls.resumed_place): a
resumed CLI carries its own history, so only the very same request is an earlier
run's call; any other is a new place after the turn's records."""

from __future__ import annotations

from typing import Any

from sessiond.gateway.places import place, resumed_place


def _steps(*recorded: tuple[int, str, str]) -> dict[str, Any]:
    return {f"k:gw.{n}": {"digest": d, "status": st} for n, d, st in recorded}


def cli_place(steps: dict[str, Any], taken: set[int], digest: str) -> int:
    return resumed_place(steps, taken, digest, place(steps, taken, digest))


def test_a_new_request_of_a_resumed_cli_is_a_new_place_not_an_old_answer() -> None:
    steps = _steps((1, "a", "ok"), (2, "b", "ok"))
    assert place(steps, set(), "c") == 1  # a program that runs from the top: replayed
    assert cli_place(steps, set(), "c") == 3  # a resumed CLI: a new call


def test_the_very_same_request_is_answered_from_its_record() -> None:
    steps = _steps((1, "a", "ok"), (2, "b", "ok"))
    assert cli_place(steps, set(), "b") == 2
    assert cli_place(steps, {2}, "b") == 3  # taken already in this run: a new call


def test_a_cut_call_is_left_and_the_next_is_past_it() -> None:
    steps = _steps((1, "a", "ok"), (2, "b", "started"))
    assert cli_place(steps, set(), "b") == 3
    assert cli_place(steps, {3}, "z") == 4


def test_a_first_run_numbers_its_calls_in_order() -> None:
    steps = _steps((1, "a", "ok"))
    assert cli_place(steps, {1}, "b") == 2
    assert cli_place({}, set(), "a") == 1
