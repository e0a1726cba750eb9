"""A spec's ``[budget]``: limits per session; 0 means no limit.

``runs_per_day``, ``seconds_per_run``, ``tokens`` and ``tool_calls_per_run`` are
checked by the resume gate and the runs; the ``tokens_per_*`` and ``cost_usd*``
keys (and ``tokens`` too) by the model gateway at each call: a day is a UTC
day, a run and a turn are the open ones. Kept apart from sessiond.table.spec so
that module stays the size of one idea.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BudgetSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    runs_per_day: int = Field(default=0, ge=0)
    seconds_per_run: int = Field(default=0, ge=0)
    tokens: int = Field(default=0, ge=0)
    tool_calls_per_run: int = Field(default=0, ge=0)
    tokens_per_run: int = Field(default=0, ge=0)
    tokens_per_turn: int = Field(default=0, ge=0)
    tokens_per_day: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)
    cost_usd_per_run: float = Field(default=0.0, ge=0)
    cost_usd_per_turn: float = Field(default=0.0, ge=0)
    cost_usd_per_day: float = Field(default=0.0, ge=0)
