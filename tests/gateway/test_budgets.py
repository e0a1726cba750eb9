"""The gateway's budgets: per run, turn, day, session and agent; spend from the fold."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from sessiond.codec import EventRecord
from sessiond.config import AgentBudget, DaemonConfig
from sessiond.gateway.budgets import Budgets, MemoryLedger, SessionSpend, TableLedger
from sessiond.log.event_data import BudgetExhausted, ModelResponded
from sessiond.log.records import CurrentRun, TurnRecord
from sessiond.log.replay import apply
from sessiond.log.state import State
from sessiond.table.budget_spec import BudgetSpec

DAY = "2026-12-06"


def budgets(**agents: AgentBudget) -> tuple[Budgets, MemoryLedger]:
    ledger = MemoryLedger()
    return Budgets(ledger, agents, today=lambda: DAY), ledger


def test_tokens_per_run_refuses_the_call_that_would_pass_it() -> None:
    b, _ = budgets()
    spec = BudgetSpec(tokens_per_run=1000)
    assert b.check("s", run=1, turn=1, agent=None, spec_budget=spec, est_tokens=400) is None
    b.charge("s", run=1, turn=1, agent=None, tokens_in=300, tokens_out=400, cost_usd=0.0)
    refusal = b.check("s", run=1, turn=1, agent=None, spec_budget=spec, est_tokens=400)
    assert refusal is not None
    assert refusal.budget == "tokens_per_run"
    assert refusal.reason == "budget: tokens_per_run: 700 of 1000 used"
    assert (
        b.check("s", run=2, turn=1, agent=None, spec_budget=spec, est_tokens=400) is None
    )  # a new run starts afresh


def refused(b: Budgets, run: int, turn: int, est: int, **budget: Any) -> str | None:
    refusal = b.check(
        "s", run=run, turn=turn, agent=None, spec_budget=BudgetSpec(**budget), est_tokens=est
    )
    return None if refusal is None else refusal.budget


def test_turn_day_and_lifetime_budgets() -> None:
    b, _ = budgets()
    b.charge("s", run=1, turn=1, agent=None, tokens_in=500, tokens_out=0, cost_usd=0.0)
    assert refused(b, 2, 1, 200, tokens_per_turn=600) == "tokens_per_turn"
    assert refused(b, 2, 2, 200, tokens_per_turn=600) is None  # a new turn
    assert refused(b, 2, 2, 200, tokens_per_day=600) == "tokens_per_day"
    assert refused(b, 2, 2, 200, tokens=600) == "tokens"
    tomorrow = Budgets(b.ledger, today=lambda: "2026-12-07")
    assert refused(tomorrow, 2, 2, 200, tokens_per_day=600) is None  # a new day


def test_cost_budgets_count_dollars() -> None:
    b, _ = budgets()
    spec = BudgetSpec(cost_usd_per_day=0.5)
    b.charge("s", run=1, turn=1, agent=None, tokens_in=10, tokens_out=10, cost_usd=0.3)
    assert b.check("s", run=1, turn=1, agent=None, spec_budget=spec, est_tokens=10) is None
    refusal = b.check(
        "s", run=1, turn=1, agent=None, spec_budget=spec, est_tokens=10, est_cost_usd=0.25
    )
    assert refusal is not None
    assert refusal.budget == "cost_usd_per_day"
    assert refusal.reason == "budget: cost_usd_per_day: $0.3 of $0.5 used"
    b.charge("s", run=1, turn=1, agent=None, tokens_in=10, tokens_out=10, cost_usd=0.2)
    assert (
        b.check("s", run=1, turn=1, agent=None, spec_budget=spec, est_tokens=0) is not None
    )  # spent: even a free guess is refused


def test_an_agents_day_counts_all_its_sessions() -> None:
    b, _ = budgets(reviewer=AgentBudget(tokens_per_day=1000))
    b.charge("a", run=1, turn=1, agent="reviewer", tokens_in=400, tokens_out=0, cost_usd=0.0)
    b.charge("b", run=1, turn=1, agent="reviewer", tokens_in=400, tokens_out=0, cost_usd=0.0)
    b.charge("c", run=1, turn=1, agent="writer", tokens_in=900, tokens_out=0, cost_usd=0.0)
    refusal = b.check(
        "d", run=1, turn=1, agent="reviewer", spec_budget=BudgetSpec(), est_tokens=300
    )
    assert refusal is not None
    assert refusal.budget == "agent_tokens_per_day"
    assert refusal.agent == "reviewer"
    assert refusal.used == 800
    assert (
        b.check("d", run=1, turn=1, agent="writer", spec_budget=BudgetSpec(), est_tokens=300)
        is None
    )  # no budget for writer
    assert b.agent_day("reviewer").tokens == 800


def test_no_budget_means_no_limit() -> None:
    b, _ = budgets()
    b.charge("s", run=1, turn=1, agent=None, tokens_in=10**9, tokens_out=0, cost_usd=10**6)
    assert (
        b.check("s", run=1, turn=1, agent=None, spec_budget=BudgetSpec(), est_tokens=10**9) is None
    )


def _record(seq: int, ts: str, data: Any) -> EventRecord:
    record = {
        "type": data.EVENT_TYPE,
        "v": 1,
        "seq": seq,
        "id": f"e{seq}",
        "ts": ts,
        "data": data.model_dump(mode="json"),
    }
    return cast(EventRecord, record)  # what the fold reads of a record


def test_spend_comes_from_the_fold_of_model_responded() -> None:
    """What a restart keeps: the budgets read the fold, so replaying the log
    gives the same refusal as before the restart."""
    state = State(session="s")
    state.current_run = cast(CurrentRun, {"run": "r3"})
    state.turn = cast(TurnRecord, {"n": 2, "calls": {}, "steps": {}})
    for seq, ts, n, cost in ((1, f"{DAY}T09:00:00Z", 300, 0.1), (2, f"{DAY}T10:00:00Z", 500, 0.2)):
        reply = ModelResponded(
            model="m", request_id=f"q{seq}", tokens_in=n, tokens_out=0, cost_usd=cost
        )
        apply(state, _record(seq, ts, reply))
    apply(
        state,
        _record(3, "2026-12-05T23:00:00Z", ModelResponded(model="m", request_id="q", tokens_in=7)),
    )
    spend = SessionSpend.from_state(
        state.tokens_in + state.tokens_out, state.cost_usd, state.model_spend
    )
    assert spend.day(DAY).tokens == 800
    assert spend.day("2026-12-05").tokens == 7
    assert spend.of_run(3).tokens == 807
    assert spend.of_turn(2).tokens == 807
    assert abs(spend.day(DAY).cost_usd - 0.3) < 1e-9

    session = SimpleNamespace(
        name="s", journal_or_none=SimpleNamespace(state=state), spec=SimpleNamespace(agent="x")
    )
    ledger = TableLedger(lambda: [session], lambda name: session)
    b = Budgets(ledger, {"x": AgentBudget(cost_usd_per_day=0.3)}, today=lambda: DAY)
    refusal = b.check(
        "s", run=3, turn=2, agent="x", spec_budget=BudgetSpec(tokens_per_run=1000), est_tokens=100
    )
    assert refusal is None or refusal.budget == "agent_cost_usd_per_day"
    refusal = b.check(
        "s", run=3, turn=2, agent=None, spec_budget=BudgetSpec(tokens_per_run=900), est_tokens=100
    )
    assert refusal is not None
    assert refusal.reason == "budget: tokens_per_run: 807 of 900 used"
    refusal = b.check("s", run=3, turn=2, agent="x", spec_budget=BudgetSpec(), est_tokens=1)
    assert refusal is not None
    assert refusal.budget == "agent_cost_usd_per_day"


def test_agent_budgets_are_daemon_config_and_cost_budgets_are_recorded() -> None:
    config = DaemonConfig.model_validate(
        {"agents": {"reviewer": {"budget": {"tokens_per_day": 5}}}}
    )
    assert config.agents["reviewer"].budget.tokens_per_day == 5
    event = BudgetExhausted(budget="cost_usd_per_day", limit=0.5, used=0.52)
    assert event.limit == 0.5


def test_an_unopened_session_counts_in_its_agents_day_from_its_entry() -> None:
    # After a start-up: the pending rows, and the spend by day their entries record
    # (one without: not counted here; the gateway opens it first, Table.ensure_spent)
    row = {"agent": "x"}
    rows = {"idle": row, "unknown": row, "theirs": {"agent": "y"}}
    open_ones: dict[str, Any] = {}  # no session open (the caller, "s", has spent nothing)
    spend = {"idle": {DAY: [100, 0.25], "2026-12-05": [7, 9.0]}, "theirs": {DAY: [5, 5.0]}}
    ledger = TableLedger(lambda: [], open_ones.__getitem__, lambda: (cast(Any, rows), spend))
    assert list(ledger.agent_sessions("x")) == ["idle"]
    b = Budgets(ledger, {"x": AgentBudget(cost_usd_per_day=0.3)}, today=lambda: DAY)
    assert b.agent_day("x").tokens == 100
    refusal = b.check("s", run=1, turn=None, agent="x", spec_budget=BudgetSpec(), est_tokens=1,
                      est_cost_usd=0.1)  # fmt: skip
    assert refusal is not None
    assert (
        refusal.reason
        == "budget: agent_cost_usd_per_day: $0.25 of $0.3 used (agent x, all its sessions)"
    )
