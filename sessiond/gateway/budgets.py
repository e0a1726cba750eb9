"""Budgets enforced at the gateway: tokens and cost per run, turn, day and agent.

Before a call goes upstream, :meth:`Budgets.check` asks whether it would pass
one of the session's ``[budget]`` keys (``tokens``, ``tokens_per_run``,
``tokens_per_turn``, ``tokens_per_day``, ``cost_usd``, ``cost_usd_per_run``,
``cost_usd_per_turn``, ``cost_usd_per_day``; 0 means no limit) or its agent's
``[agents.NAME.budget]`` (``tokens_per_day``, ``cost_usd_per_day``, over all the
agent's sessions). A call is refused when what was spent plus its estimate would
go past a limit; the caller answers it in the provider's error shape and
suspends the session with :attr:`Refusal.reason`.

What was spent is read from each session's fold (``State.model_spend``, built
from its ``model.responded`` events), never kept only in memory: a restart of
the daemon, a fork or an import keeps it. A day is a UTC day.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

import structlog

from sessiond.log.state import ModelSpend, SpendKey
from sessiond.replies import PsRow

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Spend:
    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True)
class SessionSpend:
    """A session's spend as its fold has it."""

    total: Spend = Spend()
    days: Mapping[str, Spend] = field(default_factory=dict)
    run: tuple[int, Spend] = (0, Spend())
    turn: tuple[int, Spend] = (0, Spend())

    def day(self, day: str) -> Spend:
        return self.days.get(day, Spend())

    def of_run(self, n: int) -> Spend:
        return self.run[1] if self.run[0] == n else Spend()

    def of_turn(self, n: int) -> Spend:
        return self.turn[1] if self.turn[0] == n else Spend()

    @classmethod
    def from_state(cls, tokens: int, cost: float, spend: ModelSpend) -> SessionSpend:
        """From a State's ``tokens_in + tokens_out``, ``cost_usd`` and ``model_spend``."""
        days = {d: Spend(int(v[0]), float(v[1])) for d, v in spend.get("days", {}).items()}
        run = spend.get("run") or [0, 0, 0.0]
        turn = spend.get("turn") or [0, 0, 0.0]
        return cls(
            Spend(tokens, cost),
            days,
            (int(run[0]), Spend(int(run[1]), float(run[2]))),
            (int(turn[0]), Spend(int(turn[1]), float(turn[2]))),
        )


class Ledger(Protocol):
    """Where spend is read from (the table's folds; a dict in unit tests)."""

    def session(self, name: str) -> SessionSpend: ...
    def agent_sessions(self, agent: str) -> Iterable[str]: ...


class AgentLimits(Protocol):
    @property
    def tokens_per_day(self) -> int: ...
    @property
    def cost_usd_per_day(self) -> float: ...


@dataclass(frozen=True)
class Refusal:
    budget: str  # the key: "tokens_per_day", ... or "agent_tokens_per_day"
    limit: int | float
    used: int | float
    agent: str | None = None

    @property
    def detail(self) -> str:
        unit = "$" if "cost" in self.budget else ""
        used = f"{self.used:.6f}".rstrip("0").rstrip(".") if unit else str(self.used)
        limit = f"{self.limit:.6f}".rstrip("0").rstrip(".") if unit else str(self.limit)
        whose = f" (agent {self.agent}, all its sessions)" if self.agent else ""
        return f"{self.budget}: {unit}{used} of {unit}{limit} used{whose}"

    @property
    def reason(self) -> str:
        """The session's reason when it is suspended (as the gate's budget reasons)."""
        return f"budget: {self.detail}"

    @property
    def message(self) -> str:
        """What the program's SDK raises."""
        return (
            f"sessiond: this call would pass the session's budget ({self.detail}); "
            "the session is suspended until an operator raises the budget "
            "(sessionctl apply) or it renews"
        )


@dataclass(eq=False)
class Hold:
    """What a call in flight may still spend, until it settles (``None``: no bound,
    it asked no cap on its output)."""

    session: str
    run: int
    turn: int | None
    agent: str | None
    tokens: int | None
    cost_usd: float | None

    def counts(self, suffix: str, session: str, run: int, turn: int | None) -> bool:
        """Whether this hold counts in a session's budget scope (``suffix``)."""
        if self.session != session:
            return False
        if suffix == "_per_run":
            return self.run == run
        if suffix == "_per_turn":
            return turn is not None and self.turn == turn
        return True


def _held(holds: Iterable[Hold]) -> tuple[int | None, float | None]:
    tokens: int | None = 0
    cost: float | None = 0.0
    for h in holds:
        tokens = None if tokens is None or h.tokens is None else tokens + h.tokens
        cost = None if cost is None or h.cost_usd is None else cost + h.cost_usd
    return tokens, cost


def _passes(limit: float, used: float, est: float, held: float | None) -> bool:
    return bool(limit) and (held is None or used + held + est > limit)


def run_number(run: int | str) -> int:
    """N of a run id "rN" (the fold keeps the open run by its number)."""
    if isinstance(run, int):
        return run
    return int(run[1:]) if run[:1] == "r" and run[1:].isdigit() else 0


def utc_day(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))


class Budgets:
    def __init__(
        self,
        ledger: Ledger,
        agents: Mapping[str, AgentLimits] | Callable[[], Mapping[str, AgentLimits]] | None = None,
        today: Callable[[], str] = utc_day,
    ) -> None:
        self.ledger = ledger
        # the agents' budgets, or what reads them now (the daemon's config: a reload)
        self._agents = agents if callable(agents) else (lambda: dict(agents or {}))
        self.today = today
        self.holds: list[Hold] = []  # the calls in flight (admit, release)
        self._settled: list[asyncio.Future[None]] = []

    @property
    def agents(self) -> Mapping[str, AgentLimits]:
        return self._agents()

    def check(  # noqa: PLR0917 (the gateway's one call, in the order of the interface)
        self,
        session: str,
        run: int | str,
        turn: int | None,
        agent: str | None,
        spec_budget: Any,
        est_tokens: int,
        est_cost_usd: float = 0.0,
        held: Sequence[Hold] = (),
    ) -> Refusal | None:
        """A refusal if this call (``est_tokens``, ``est_cost_usd``) would pass a budget,
        with what the calls in ``held`` may still spend."""
        spent = self.ledger.session(session)
        day = self.today()
        n = run_number(run)
        scopes = (
            ("", spent.total),
            ("_per_run", spent.of_run(n)),
            ("_per_turn", spent.of_turn(turn) if turn is not None else Spend()),
            ("_per_day", spent.day(day)),
        )
        for suffix, used in scopes:
            tokens_held, cost_held = _held(h for h in held if h.counts(suffix, session, n, turn))
            limit = getattr(spec_budget, "tokens" + suffix, 0) or 0
            if _passes(limit, used.tokens, est_tokens, tokens_held):
                return Refusal("tokens" + suffix, limit, used.tokens)
            cost = getattr(spec_budget, "cost_usd" + suffix, 0.0) or 0.0
            if _passes(cost, used.cost_usd, est_cost_usd, cost_held) or (
                cost and used.cost_usd >= cost
            ):
                return Refusal("cost_usd" + suffix, cost, round(used.cost_usd, 6))
        limits = self.agents.get(agent) if agent else None
        if limits is not None and (limits.tokens_per_day or limits.cost_usd_per_day):
            assert agent is not None
            used = self.agent_day(agent, day)
            tokens_held, cost_held = _held(h for h in held if h.agent == agent)
            if _passes(limits.tokens_per_day, used.tokens, est_tokens, tokens_held):
                return Refusal("agent_tokens_per_day", limits.tokens_per_day, used.tokens, agent)
            cost = limits.cost_usd_per_day
            if _passes(cost, used.cost_usd, est_cost_usd, cost_held) or (
                cost and used.cost_usd >= cost
            ):
                return Refusal("agent_cost_usd_per_day", cost, round(used.cost_usd, 6), agent)
        return None

    async def admit(  # noqa: PLR0917 (as check)
        self,
        session: str,
        run: int | str,
        turn: int | None,
        agent: str | None,
        spec_budget: Any,
        est_tokens: int,
        most: tuple[int | None, float | None],
    ) -> Refusal | Hold:
        """A refusal if this call would pass a budget by what was spent; else, once the
        calls in flight leave it room, a hold of ``most`` (what it may spend at most:
        tokens, dollars; ``None`` for no bound) that :meth:`release` gives back when
        it settles."""
        args = (session, run, turn, agent, spec_budget, est_tokens)
        while True:
            refusal = self.check(*args)
            if refusal is not None:
                return refusal
            if self.check(*args, held=self.holds) is None:
                hold = Hold(session, run_number(run), turn, agent, *most)
                self.holds.append(hold)
                return hold
            log.info("gateway.budget_wait", session=session, in_flight=len(self.holds))
            settled = asyncio.get_running_loop().create_future()
            self._settled.append(settled)
            try:
                await settled
            finally:
                if settled in self._settled:
                    self._settled.remove(settled)

    def release(self, hold: Hold) -> None:
        """A call settled (what it spent is in its session's fold, or it spent
        nothing): the calls waiting on it are judged again."""
        if hold in self.holds:
            self.holds.remove(hold)
        waiting, self._settled = self._settled, []
        for settled in waiting:
            if not settled.done():
                settled.set_result(None)

    def charge(  # noqa: PLR0917 (as check)
        self,
        session: str,
        run: int | str,
        turn: int | None,
        agent: str | None,
        tokens_in: int,
        tokens_out: int,
        cost_usd: float,
    ) -> None:
        """A reply's use. The session's own spend is its fold's (its
        ``model.responded``, appended by the caller); a ledger that keeps its own
        (the unit tests') is told here."""
        charge = getattr(self.ledger, "charge", None)
        if charge is not None:
            charge(
                session,
                run_number(run),
                turn or 0,
                agent,
                tokens_in + tokens_out,
                cost_usd,
                self.today(),
            )

    def agent_day(self, agent: str, day: str | None = None) -> Spend:
        """What all the agent's sessions spent on ``day`` (today)."""
        day = day or self.today()
        tokens, cost = 0, 0.0
        for name in self.ledger.agent_sessions(agent):
            used = self.ledger.session(name).day(day)
            tokens += used.tokens
            cost += used.cost_usd
        return Spend(tokens, cost)


class TableLedger:
    """Spend from the process table's folds (``State.model_spend``), and for a
    session not opened yet after a start-up, from its index entry (``unopened``:
    the pending sessions' rows, and their spend by day where their entries say;
    the caller opens first any of an agent's that has none: Table.ensure_spent)."""

    def __init__(
        self,
        sessions: Callable[[], Iterable[Any]],
        get: Callable[[str], Any],
        unopened: Callable[[], tuple[Mapping[str, PsRow], Mapping[str, dict[str, list[float]]]]]
        | None = None,
    ) -> None:
        self._sessions, self._get = sessions, get
        self._unopened = unopened or (lambda: ({}, {}))

    def session(self, name: str) -> SessionSpend:
        """A session's spend; one not opened yet: its days only, from its entry
        (what an agent's daily budget reads; a call's own session is open)."""
        rows, spend = self._unopened()
        if name in rows:
            days = spend.get(name, {})
            return SessionSpend(days={d: Spend(int(v[0]), float(v[1])) for d, v in days.items()})
        try:
            s = self._get(name)
        except Exception:
            return SessionSpend()
        journal = s.journal_or_none  # None: a session whose log could not be opened
        if journal is None:
            return SessionSpend()
        st = journal.state
        return SessionSpend.from_state(st.tokens_in + st.tokens_out, st.cost_usd, st.model_spend)

    def agent_sessions(self, agent: str) -> Iterable[str]:
        for s in self._sessions():
            if s.spec is not None and s.spec.agent == agent:
                yield s.name
        rows, spend = self._unopened()
        # a pending row's agent is its spec's (its entry has a spend only with a spec)
        yield from (n for n, row in rows.items() if row["agent"] == agent and n in spend)


class _Charged(TypedDict):
    tokens: int
    cost: float
    spend: ModelSpend


class MemoryLedger:
    """Spend kept in memory (unit tests, the benchmarks)."""

    def __init__(self) -> None:
        self.spent: dict[str, _Charged] = {}
        self.agents: dict[str, set[str]] = {}

    def session(self, name: str) -> SessionSpend:
        d = self.spent.get(name)
        if d is None:
            return SessionSpend()
        return SessionSpend.from_state(d["tokens"], d["cost"], d["spend"])

    def agent_sessions(self, agent: str) -> Iterable[str]:
        return sorted(self.agents.get(agent, ()))

    def charge(  # noqa: PLR0917 (Budgets.charge's one call)
        self,
        session: str,
        run: int,
        turn: int,
        agent: str | None,
        tokens: int,
        cost: float,
        day: str,
    ) -> None:
        d = self.spent.setdefault(session, {"tokens": 0, "cost": 0.0, "spend": {}})
        d["tokens"] += tokens
        d["cost"] += cost
        spend = d["spend"]
        used = spend.setdefault("days", {}).setdefault(day, [0, 0.0])
        used[0] += tokens
        used[1] += cost
        keys: tuple[tuple[SpendKey, int], ...] = (("run", run), ("turn", turn))
        for key, n in keys:
            mine = spend.get(key)
            if mine is None or mine[0] != n:
                spend[key] = mine = [n, 0, 0.0]
            mine[1] += tokens
            mine[2] += cost
        if agent:
            self.agents.setdefault(agent, set()).add(session)
