"""Where a session may run in a cluster (docs/design.md section 10, "Failover", "Wakes"):
the columns of its row that the store's claims check.

Three things of a session's stored spec decide it, recorded in its row of
``sessions`` whenever the spec is written (``create``, ``write_spec``), as the
store's ``placement_for`` says (the cluster floor's: sessiond.cluster.placement
reads them from the parsed spec):

- ``pinned``: the spec's ``node = "…"``: only that node owns and runs it;
- ``needs``: the spec's ``node_labels = { … }``: only a node whose ``[cluster]
  labels`` has each of them (same key, same value);
- ``workspace_node``: workspaces belong to machines. The node that wrote the spec
  (or the pinned one) holds the workspace — ``run.cwd`` and any git trigger's
  ``repo`` — unless every one of those lies under a ``[cluster] shared_paths``
  folder, or there is none; then it is NULL and the session may fail over.

Every claim of a session a node does not own already, every hand-over
(``migrate --node``, ``drain``) and every take-over checks :func:`fits` in the
same statement that moves it. A session whose owner died and that fits no live
node waits, and ``ps``/``show`` say for what (sessiond.cluster.placement).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def fits(node: str, labels: str) -> str:
    """SQL: the session row ``s`` may run on the node named by the SQL expression
    ``node`` whose labels (jsonb) are the SQL expression ``labels``."""
    return (
        f"((s.pinned IS NULL OR s.pinned = {node}) "
        f"AND (s.workspace_node IS NULL OR s.workspace_node = {node}) "
        f"AND s.needs <@ {labels})"
    )


PLACE = """
UPDATE sessions SET pinned = %(pinned)s, needs = %(needs)s::jsonb,
    workspace = %(workspace)s, workspace_node = %(workspace_node)s
WHERE name = %(n)s
"""


@dataclass(frozen=True)
class Placement:
    pinned: str | None = None
    needs: dict[str, str] = field(default_factory=dict)
    workspace: str | None = None  # the first local path (or the first path) of the workspace
    workspace_node: str | None = None

    def params(self, name: str) -> dict[str, object]:
        return {
            "n": name,
            "pinned": self.pinned,
            "needs": json.dumps(self.needs, sort_keys=True),
            "workspace": self.workspace,
            "workspace_node": self.workspace_node,
        }

    @property
    def home(self) -> str | None:
        """The one node it may run on, if there is one."""
        return self.pinned or self.workspace_node

    def refusal(self, node: str, labels: dict[str, str]) -> str | None:
        """Why the session may not run on ``node`` (None: it may)."""
        if self.pinned is not None and self.pinned != node:
            return f'it is pinned to node {self.pinned!r} (its spec says node = "{self.pinned}")'
        if self.workspace_node is not None and self.workspace_node != node:
            return (
                f"its workspace {self.workspace} lives on node {self.workspace_node!r} and is "
                "not under [cluster] shared_paths"
            )
        missing = {k: v for k, v in self.needs.items() if labels.get(k) != v}
        if missing:
            has = format_labels(labels) or "none"
            return (
                f"node {node!r} lacks the labels it needs: {format_labels(missing)} (it has {has})"
            )
        return None


def format_labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def from_row(pinned: str | None, needs: Any, workspace: str | None, node: str | None) -> Placement:
    needs_dict = needs if isinstance(needs, dict) else json.loads(needs or "{}")
    return Placement(pinned, {str(k): str(v) for k, v in needs_dict.items()}, workspace, node)


# What the store records of a spec it writes: its text -> its placement.
PlacementFor = Callable[[str | None], Placement]


def unplaced(_spec: str | None) -> Placement:
    """A store made without the cluster's rules (tools, tests): no pin, no labels,
    no workspace node: any node may run each session."""
    return Placement()
