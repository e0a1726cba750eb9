"""``models``: the model gateway as the operator sees it, and its queue in ``ps``/``show``.

The providers, their limits and what they hold now, and the calls waiting for
the model come from the gateway (a :class:`ModelsSource`, set by the daemon when
it runs one; the gateway is a floor above this one). What each session and each
agent spent today is read here from the sessions' folds (``model_spend``), so it
is the same before and after a restart.
"""

from __future__ import annotations

from typing import Protocol

from sessiond.log.pace import Pacer
from sessiond.replies import AgentSpent, ModelsReply, ModelsView, PsRow, SessionDetail, SessionSpent
from sessiond.runs.context import RunContext
from sessiond.table.sessions import Session

NO_GATEWAY: ModelsView = {"providers": [], "queue": [], "served": 0, "throttled": 0}


class ModelsSource(Protocol):
    def positions(self) -> dict[str, int]:
        """Each session with a call waiting for the model: the calls ahead of it."""
        ...

    def models_view(self) -> ModelsView:
        """``providers`` (each with its limits and their use now), ``queue``,
        ``served``, ``throttled``."""
        ...


def waiting_text(ahead: int) -> str:
    return f"waiting for model: {ahead} ahead"


class Models:
    def __init__(self, ctx: RunContext, source: ModelsSource | None = None) -> None:
        self.ctx = ctx
        self.source = source  # the gateway's queue; None: this daemon runs no gateway

    def positions(self) -> dict[str, int]:
        return self.source.positions() if self.source is not None else {}

    def mark(self, row: PsRow | SessionDetail, positions: dict[str, int]) -> None:
        """A ``ps`` row or ``show`` of a session whose call waits for the model."""
        ahead = positions.get(row["name"])
        if ahead is not None:
            row["model_ahead"] = ahead
            row["reason"] = waiting_text(ahead)

    async def models(self) -> ModelsReply:
        """`sessionctl models`: providers, limits, the queue, today's spend."""
        view = self.source.models_view() if self.source is not None else NO_GATEWAY.copy()
        day = self.ctx.now()[:10]
        agents_config = self.ctx.config.agents
        sessions: list[SessionSpent] = []
        agents: dict[str, AgentSpent] = {}
        pacer = Pacer()
        await self.ctx.table.ensure_all()  # each session's spend is in its log
        for s in sorted(self.ctx.table, key=lambda s: s.name):
            if pacer.due():
                await pacer.pause()
            used = _today(s, day)
            if used is None:
                continue
            tokens, cost = used
            agent = s.spec.agent if s.spec is not None else ""
            budget = s.spec.budget if s.spec is not None else None
            sessions.append(
                {
                    "session": s.name,
                    "agent": agent or None,
                    "tokens": tokens,
                    "cost_usd": round(cost, 6),
                    "tokens_per_day": budget.tokens_per_day if budget is not None else 0,
                    "cost_usd_per_day": budget.cost_usd_per_day if budget is not None else 0.0,
                }
            )
            if agent:
                a = agents.setdefault(agent, _agent(agent))
                a["sessions"] += 1
                a["tokens"] += tokens
                a["cost_usd"] = round(a["cost_usd"] + cost, 6)
        for name, conf in agents_config.items():
            a = agents.setdefault(name, _agent(name))
            a["tokens_per_day"] = conf.budget.tokens_per_day
            a["cost_usd_per_day"] = conf.budget.cost_usd_per_day
        return {
            **view,
            "day": day,
            "gateway": self.source is not None,
            "sessions": sessions,
            "agents": sorted(agents.values(), key=lambda a: a["agent"]),
        }


def _agent(name: str) -> AgentSpent:
    """An agent nothing has been counted for yet (no budget until its configuration's)."""
    return {"agent": name, "sessions": 0, "tokens": 0, "cost_usd": 0.0, "tokens_per_day": 0,
            "cost_usd_per_day": 0.0}  # fmt: skip


def _today(s: Session, day: str) -> tuple[int, float] | None:
    """What the session's replies used on ``day``, from its fold; None if nothing."""
    if s.journal_or_none is None:
        return None
    used = s.journal.state.model_spend.get("days", {}).get(day)
    if not used or not (used[0] or used[1]):
        return None
    return int(used[0]), float(used[1])
