"""A model call's place in its turn (``gw.<n>``): which earlier run's record a call
is, so a later run of the turn is answered from the log and never sent twice
(gateway/calls.py takes a place for each call before any await)."""

from __future__ import annotations

from typing import Any

from sessiond.log.records import TurnRecord


class Earlier:
    """The places the earlier runs of each session's open turn recorded finished,
    by request digest: read at a run's first call (what earlier runs recorded does
    not change while it runs), one pass, then looked up."""

    def __init__(self) -> None:
        # session -> ((turn, runs), digest -> places, ascending)
        self._of: dict[str, tuple[tuple[int, int], dict[str, list[int]]]] = {}

    def places(self, session: str, turn: TurnRecord) -> dict[str, list[int]]:
        at = (turn["n"], turn["runs"])
        known = self._of.get(session)
        if known is not None and known[0] == at:
            return known[1]
        found: dict[str, list[int]] = {}
        for slot, st in turn["steps"].items():
            digest = st.get("digest")
            if digest and st["status"] == "ok" and slot.startswith("k:gw.") and slot[5:].isdigit():
                found.setdefault(digest, []).append(int(slot[5:]))
        for places in found.values():
            places.sort()
        self._of[session] = (at, found)
        return found


# steps: the turn's (StepRecord by slot), any mapping of the keys read (the unit tests')
def place(steps: dict[str, Any], taken: set[int], digest: str) -> int:
    """The place ``gw.<n>`` of a call in its turn: the first place an earlier run
    recorded for the very same request (its digest) that this run has not taken, so
    calls sent at once (``asyncio.gather``, threads) find their own records whatever
    order they arrive in; else the first place this run has not taken (in call order:
    a changed request, or a new call)."""
    # one plain pass, the digest first (it rules out nearly every other step): this
    # runs for every call, over every step of the turn
    best = 0
    for slot, st in steps.items():
        if (
            st.get("digest") == digest
            and st.get("status") == "ok"
            and slot.startswith("k:gw.")
            and slot[5:].isdigit()
        ):
            n = int(slot[5:])
            if n not in taken and (not best or n < best):
                best = n
    if best:
        return best
    # the places a run takes are mostly 1..k: then the next is k + 1 at once
    n = len(taken) + 1 if taken and max(taken) == len(taken) else 1
    while n in taken:
        n += 1
    return n


def resumed_place(steps: dict[str, Any], taken: set[int], digest: str, n: int) -> int:  # as place
    """The place of an agent CLI's call (``claude-code``, ``codex``): the CLI resumes
    its own history in a later run of the turn, so a call is an earlier run's only
    for the very same request; any other is a new place after those the turn
    recorded, never answered with the response to another request."""
    recorded = steps.get(f"k:gw.{n}")
    if recorded is None or recorded.get("digest") == digest:
        return n
    while n in taken or f"k:gw.{n}" in steps:
        n += 1
    return n
