"""A spec's ``[compact]`` table: the command that summarises older context.

The command is named by the spec and may live in the workspace its program
writes, so it runs like that program (sessiond.runs.commands): confined, as
``[run] user``, and stopped with everything it started past ``timeout``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessiond.durations import Duration


class CompactSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    exec: list[str] = Field(min_length=1)
    timeout: Duration = 60.0

    @field_validator("timeout")
    @classmethod
    def _bounded_timeout(cls, value: float) -> float:
        if not 0 < value <= 3600:
            raise ValueError("the compaction timeout must be more than 0s and at most 1h")
        return value
