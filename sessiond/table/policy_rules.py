"""How a ``[policy]`` decides one tool: the first of its lists (deny, ask, allow)
with a pattern that matches the tool's name, else the default of the tool's side
effect. Apart from sessiond.table.policy (the rest: how a spec may not widen its
caller's) so that the spec's own checks can decide a tool too: the spec module
imports this, and sessiond.table.policy imports the spec.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Protocol


class PolicyLists(Protocol):
    """The three lists of a ``[policy]`` (sessiond.table.spec.PolicySpec)."""

    @property
    def allow(self) -> list[str]: ...

    @property
    def ask(self) -> list[str]: ...

    @property
    def deny(self) -> list[str]: ...


DEFAULT_BY_SIDE_EFFECT = {
    "none": "allow",
    "read": "allow",
    "workspace-write": "allow",
    "external-write": "ask",
}


@dataclass(frozen=True)
class PolicyVerdict:
    decision: str  # allow | ask | deny
    rule: str  # e.g. "ask: edit_*" or "default: external-write asks"


def decide(policy: PolicyLists, tool: str, side_effect: str) -> PolicyVerdict:
    for decision, patterns in (("deny", policy.deny), ("ask", policy.ask), ("allow", policy.allow)):
        for pattern in patterns:
            if fnmatch.fnmatchcase(tool, pattern):
                return PolicyVerdict(decision, f"{decision}: {pattern}")
    default = DEFAULT_BY_SIDE_EFFECT.get(side_effect, "ask")
    verb = {"allow": "allowed", "ask": "asks"}[default]
    return PolicyVerdict(default, f"default: {side_effect} {verb}")
