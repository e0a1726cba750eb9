"""Where a session may run in a cluster (docs/design.md section 10, "Failover", "Wakes").

Three things of a session's stored spec decide it, recorded in its row of
``sessions`` whenever the spec is written (``create``, ``write_spec``):

- ``pinned``: the spec's ``node = "…"``: only that node owns and runs it;
- ``needs``: the spec's ``node_labels = { … }``: only a node whose ``[cluster]
  labels`` has each of them (same key, same value);
- ``workspace_node``: workspaces belong to machines. The node that wrote the spec
  (or the pinned one) holds the workspace — ``run.cwd`` and any git trigger's
  ``repo`` — unless every one of those lies under a ``[cluster] shared_paths``
  folder, or there is none; then it is NULL and the session may fail over.

Every claim of a session a node does not own already, every hand-over
(``migrate --node``, ``drain``) and every take-over checks :data:`FITS` in the
same statement that moves it. A session whose owner died and that fits no live
node waits, and ``ps``/``show`` say for what (:func:`waiting_reason`).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessiond.log.store.pg.nodes import Lease


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

    def params(self, name: str) -> dict[str, Any]:
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


def _under(path: str, shared: Sequence[Path]) -> bool:
    # the stored workspace is resolved (symlinks followed): so is each shared folder
    p = Path(path)
    roots = {r for root in shared for r in (root, Path(os.path.realpath(root)))}
    return any(p.is_relative_to(root) for root in roots)


def placement_of(spec: str | None, *, here: str, shared: Sequence[Path]) -> Placement:
    """The placement a stored spec (TOML, paths resolved) asks for, written on node ``here``."""
    if not spec:
        return Placement()
    try:
        data = tomllib.loads(spec)
    except tomllib.TOMLDecodeError:
        return Placement()  # a spec that does not parse is refused elsewhere, with the reason
    pinned = data.get("node") if isinstance(data.get("node"), str) else None
    raw = data.get("node_labels")
    needs = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    paths: list[str] = []
    run = data.get("run")
    if isinstance(run, dict):
        paths.append(str(run.get("cwd", ".")))
    for trig in data.get("trigger") or []:
        if isinstance(trig, dict) and trig.get("type") == "git":
            paths.append(str(trig.get("repo", ".")))
    local = [p for p in paths if not _under(p, shared)]
    workspace = (local or paths)[0] if paths else None
    return Placement(pinned, needs, workspace, (pinned or here) if local else None)


def waiting_reason(p: Placement, owner: str | None) -> str:
    """What a session nobody runs now waits for, as ``ps`` and ``show`` say it."""
    if p.pinned is not None:
        return f"waiting for node {p.pinned} (its spec pins it there)"
    if p.workspace_node is not None:
        return f"waiting for node {p.workspace_node} (its workspace {p.workspace} lives there)"
    if p.needs:
        return f"waiting for a node with labels {format_labels(p.needs)}"
    if owner is not None:
        return f"waiting for a node to take it over from node {owner}"
    return "waiting for a node to take it"


def from_row(pinned: str | None, needs: Any, workspace: str | None, node: str | None) -> Placement:
    needs_dict = needs if isinstance(needs, dict) else json.loads(needs or "{}")
    return Placement(pinned, {str(k): str(v) for k, v in needs_dict.items()}, workspace, node)


Query = Callable[[str, dict[str, Any]], list[tuple[Any, ...]]]

# ``migrate S --node N --force``: the workspace moves to N, in one statement that
# holds only while nobody runs the session (no owner, or its lease lapsed) and N is
# up and may run it but for the workspace (its pin and labels still hold).
REHOME = """
UPDATE sessions AS s SET workspace_node = n.name
FROM nodes AS n
WHERE s.name = %(n)s AND n.name = %(to)s AND n.lease_until > now() AND n.state = 'up'
  AND s.workspace_node IS NOT NULL
  AND (s.pinned IS NULL OR s.pinned = n.name) AND s.needs <@ n.labels
  AND NOT EXISTS (SELECT 1 FROM nodes AS o WHERE o.name = s.owner AND o.lease_until > now())
RETURNING s.name
"""


class PlacementQueries:
    """PgStore's placement queries (a mixin: it has ``_query`` and ``lease``)."""

    _query: Query
    lease: Lease
    shared_paths: Sequence[Path]

    def placement_for(self, spec: str | None) -> Placement:
        return placement_of(spec, here=self.lease.name, shared=self.shared_paths)

    def placement(self, name: str) -> tuple[Placement, str | None, bool] | None:
        """A session's placement, its owner and whether that owner's lease runs
        (None: no such session)."""
        rows = self._query(
            "SELECT s.pinned, s.needs, s.workspace, s.workspace_node, s.owner, "
            "coalesce(n.lease_until > now(), false) "
            "FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner WHERE s.name = %(n)s",
            {"n": name},
        )
        if not rows:
            return None
        pinned, needs, workspace, node, owner, alive = rows[0]
        return from_row(pinned, needs, workspace, node), owner, bool(alive)

    def node_row(self, name: str) -> tuple[bool, str, dict[str, str]] | None:
        """(alive, state, labels) of node ``name``; None: no such node."""
        rows = self._query(
            "SELECT lease_until > now(), state, labels FROM nodes WHERE name = %(n)s", {"n": name}
        )
        if not rows:
            return None
        alive, state, labels = rows[0]
        return bool(alive), str(state), {str(k): str(v) for k, v in (labels or {}).items()}

    def waiting(self) -> list[dict[str, Any]]:
        """``ps`` rows of the sessions no live node runs, each saying what it waits for."""
        rows = self._query(
            "SELECT s.name, s.owner, s.pinned, s.needs, s.workspace, s.workspace_node "
            "FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner "
            "WHERE s.owner IS NULL OR n.lease_until <= now() ORDER BY s.name",
            {},
        )
        out = []
        for name, owner, pinned, needs, workspace, node in rows:
            p = from_row(pinned, needs, workspace, node)
            out.append({"name": name, "node": p.home or owner, "reason": waiting_reason(p, owner)})
        return out

    def misplaced(self) -> list[str]:
        """This node's sessions it may not run (a spec pinned elsewhere, created,
        forked or reloaded here; labels it lacks): to hand over at a stable point."""
        rows = self._query(
            "SELECT s.name FROM sessions AS s WHERE s.owner = %(me)s "
            f"AND NOT {fits('%(me)s', '%(labels)s::jsonb')} ORDER BY s.name",
            {"me": self.lease.name, "labels": self.lease.labels},
        )
        return [r[0] for r in rows]

    def release(self, name: str) -> bool:
        """Let go of ``name`` (ours) for no node in particular: the node it fits
        claims it when it is up. The epoch goes up, so nothing of ours lands after."""
        rows = self._query(
            "UPDATE sessions SET owner = NULL, epoch = epoch + 1 "
            "WHERE name = %(n)s AND owner = %(me)s RETURNING name",
            {"n": name, "me": self.lease.name},
        )
        return bool(rows)

    def target_for(self, name: str, to: str | None) -> str | None:
        """The live node that is up (not draining), not this one, that ``name`` may
        run on: ``to``, or the one with the fewest sessions. None: there is none."""
        rows = self._query(
            "SELECT n.name FROM nodes AS n, sessions AS s WHERE n.lease_until > now() "
            "AND n.state = 'up' AND n.name <> %(me)s "
            "AND (%(to)s::text IS NULL OR n.name = %(to)s) "
            f"AND s.name = %(n)s AND {fits('n.name', 'n.labels')} "
            "ORDER BY (SELECT count(*) FROM sessions AS c WHERE c.owner = n.name), n.name "
            "LIMIT 1",
            {"n": name, "to": to, "me": self.lease.name},
        )
        return str(rows[0][0]) if rows else None

    def rehome(self, name: str, to: str) -> bool:
        """Say that the workspace of ``name``, whose node is down, is on ``to`` now;
        ``to``'s take-over then claims it under a new epoch, through replay and the
        gate, as after a crash. False: it runs again somewhere, or ``to`` may not
        run it (the caller says why, from :meth:`placement` and :meth:`node_row`)."""
        return bool(self._query(REHOME, {"n": name, "to": to}))

    def homed_on(self, node: str) -> int:
        """How many sessions run only on ``node`` (pinned there, or their workspace is)."""
        rows = self._query(
            "SELECT count(*) FROM sessions WHERE coalesce(pinned, workspace_node) = %(n)s",
            {"n": node},
        )
        return int(rows[0][0])

    def movable(self) -> list[str]:
        """This node's sessions that may run elsewhere (not pinned here, no workspace only here)."""
        rows = self._query(
            "SELECT name FROM sessions WHERE owner = %(me)s "
            "AND coalesce(pinned, workspace_node) IS DISTINCT FROM %(me)s ORDER BY name",
            {"me": self.lease.name},
        )
        return [r[0] for r in rows]
