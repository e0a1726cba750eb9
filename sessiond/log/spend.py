"""The fold of what the model cost: a reply's tokens and cost by UTC day, and for
the open run and turn (``State.model_spend``). The gateway's budgets read it
(gateway/budgets.py), so a restart keeps what was spent: it is replayed, never
counted again in memory."""

from __future__ import annotations

from sessiond.log.state import RUN_DAYS_KEEP, SpendKey, State


def run_number(run: str) -> int:
    """N of a run id "rN" (or a call id "rN.command..."); 0 for anything else."""
    head = run.split(".", 1)[0]
    return int(head[1:]) if head[:1] == "r" and head[1:].isdigit() else 0


def spent(s: State, day: str, tokens: int, cost: float) -> None:
    """A reply's tokens and cost, by day and for the open run and turn."""
    spend = s.model_spend
    days = spend.setdefault("days", {})
    used = days.setdefault(day, [0, 0.0])
    used[0] += tokens
    used[1] += cost
    if len(days) > RUN_DAYS_KEEP:  # only recent days matter for a day's budget
        for old in sorted(days)[:-RUN_DAYS_KEEP]:
            del days[old]
    run = run_number(s.current_run["run"]) if s.current_run is not None else s.run_number
    turn = s.turn["n"] if s.turn is not None else s.turn_number
    keys: tuple[tuple[SpendKey, int], ...] = (("run", run), ("turn", turn))
    for key, n in keys:
        mine = spend.get(key)
        if mine is None or mine[0] != n:
            spend[key] = mine = [n, 0, 0.0]
        mine[1] += tokens
        mine[2] += cost
