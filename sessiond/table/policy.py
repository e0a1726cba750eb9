"""Tool policy: which intents run, which need a person, which never run.

A session's ``[policy]`` lists tool names (globs) under ``deny``, ``ask`` and
``allow``; the first list that matches decides, in that order, so a deny always
wins. A tool no list names is decided by its side effect: ``none``, ``read``
and ``workspace-write`` are allowed, ``external-write`` asks. The decision
names the rule that matched, and is recorded as ``policy.decided``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from sessiond.table.spec import PolicySpec

DEFAULT_BY_SIDE_EFFECT = {
    "none": "allow",
    "read": "allow",
    "workspace-write": "allow",
    "external-write": "ask",
}


@dataclass(frozen=True)
class Verdict:
    decision: str  # allow | ask | deny
    rule: str  # e.g. "ask: edit_*" or "default: external-write asks"


def decide(policy: PolicySpec, tool: str, side_effect: str) -> Verdict:
    for decision, patterns in (("deny", policy.deny), ("ask", policy.ask), ("allow", policy.allow)):
        for pattern in patterns:
            if fnmatch.fnmatchcase(tool, pattern):
                return Verdict(decision, f"{decision}: {pattern}")
    default = DEFAULT_BY_SIDE_EFFECT.get(side_effect, "ask")
    verb = {"allow": "allowed", "ask": "asks"}[default]
    return Verdict(default, f"default: {side_effect} {verb}")
