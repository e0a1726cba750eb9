"""The cluster's coordination on its PostgreSQL (sessiond.cluster.coordination).

The same database as the store (sessiond.log.store.pg), other questions: the
``nodes`` table and the ownership and placement columns of ``sessions``. Every
move of a session (a hand-over, a release, a re-home) bumps or checks what the
store's claims check, in one statement, so that coordination and the store's
fence never disagree: a session moved here can no longer be written by the node
it left.
"""

from __future__ import annotations

from sessiond.cluster.balance import fair_shares, least_loaded, loads_of
from sessiond.cluster.coordination import Coordination
from sessiond.cluster.placement import waiting_reason
from sessiond.log.store.pg.pgstore import PgStore
from sessiond.log.store.pg.placement import Placement, fits, from_row
from sessiond.names import check_name
from sessiond.replies import NodeRow, Unplaced

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


# The sessions to deal out: nobody's, or their node's lease lapsed, and some live
# node that takes sessions may run them (the others wait, and would only fill
# the batch).
UNOWNED = f"""
SELECT s.name, s.pinned, s.needs, s.workspace, s.workspace_node
FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner
WHERE (s.owner IS NULL OR n.lease_until <= now())
  AND EXISTS (SELECT 1 FROM nodes AS t WHERE t.lease_until > now() AND t.state = 'up'
              AND {fits("t.name", "t.labels")})
ORDER BY s.name LIMIT %(n)s
"""

# Each dealt to its node, in one statement that checks again what the choice
# assumed (still nobody's, the node live, up and fitting): of two nodes dealing at
# once, one moves each session. SKIP LOCKED: rows another node is dealing or
# claiming right now are passed over, never waited for (no deadlock between two
# batches).
DEAL = f"""
WITH d AS (SELECT * FROM unnest(%(names)s::text[], %(nodes)s::text[]) AS d(name, node)),
mine AS (SELECT s.name FROM sessions AS s JOIN d ON d.name = s.name
         ORDER BY s.name FOR UPDATE OF s SKIP LOCKED)
UPDATE sessions AS s SET owner = t.name, epoch = s.epoch + 1
FROM d, nodes AS t
WHERE s.name IN (SELECT name FROM mine) AND d.name = s.name AND t.name = d.node
  AND t.lease_until > now() AND t.state = 'up' AND {fits("t.name", "t.labels")}
  AND (s.owner IS NULL OR NOT EXISTS (SELECT 1 FROM nodes AS o
                                      WHERE o.name = s.owner AND o.lease_until > now()))
RETURNING s.name, t.name
"""


class PgCoordination(Coordination):
    """Coordination through the store's database, for the store's node."""

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self.lease = store.lease
        self.node = store.lease.name
        self._query = store.select

    # --- membership ----------------------------------------------------------------

    def nodes(self) -> list[NodeRow]:
        rows = self._query(
            "SELECT n.name, n.incarnation, n.state, n.lease_until > now(), "
            "extract(epoch FROM now() - n.renewed_at)::float8, "
            "extract(epoch FROM n.lease_until - now())::float8, n.started_at, n.labels, "
            "(SELECT count(*) FROM sessions AS s WHERE s.owner = n.name), "
            "n.running, n.ready, n.max_running "
            "FROM nodes AS n ORDER BY n.name",
            {},
        )
        listed: list[NodeRow] = [
            {
                "name": name,
                "incarnation": int(inc),
                "state": state if alive else ("stopped" if state == "stopped" else "lapsed"),
                "alive": bool(alive),
                "lease_age_s": round(float(age), 3),
                "lease_left_s": round(max(float(left), 0.0), 3),
                "started_at": started.isoformat(),
                "labels": labels,
                "sessions": int(count),
                "self": name == self.node,
                "running": int(running),
                "ready": int(ready),
                "max_running": int(slots),
                "share": 0.0,
            }
            for name, inc, state, alive, age, left, started, labels, count, *load in rows
            for running, ready, slots in [load]
        ]
        shares = fair_shares(listed)
        for r in listed:
            r["share"] = round(shares[r["name"]], 2)
        return listed

    def publish(self, running: int, ready: int, max_running: int) -> None:
        self._query(
            "UPDATE nodes SET running = %(r)s, ready = %(q)s, max_running = %(m)s "
            "WHERE name = %(name)s AND incarnation = %(inc)s RETURNING name",
            {**self.lease.params(), "r": running, "q": ready, "m": max_running},
        )

    def node_row(self, name: str) -> tuple[bool, str, dict[str, str]] | None:
        rows = self._query(
            "SELECT lease_until > now(), state, labels FROM nodes WHERE name = %(n)s", {"n": name}
        )
        if not rows:
            return None
        alive, state, labels = rows[0]
        return bool(alive), str(state), {str(k): str(v) for k, v in (labels or {}).items()}

    def drain(self, node: str) -> int | None:
        rows = self._query(
            "UPDATE nodes AS n SET state = 'draining' WHERE n.name = %(n)s "
            "AND n.lease_until > now() RETURNING "
            "(SELECT count(*) FROM sessions AS s WHERE s.owner = n.name)",
            {"n": node},
        )
        return int(rows[0][0]) if rows else None

    # --- ownership -----------------------------------------------------------------

    def orphans(self, limit: int = 100) -> list[str]:
        """Deals, then lists this node's: every one (the caller passes over those it
        runs already), so that one handed here is found however many it holds.
        The claim itself (the store's, log/store/pg/nodes.py) decides who gets one."""
        self.deal(limit)
        rows = self._query(
            "SELECT name FROM sessions WHERE owner = %(me)s ORDER BY name", {"me": self.node}
        )
        return [r[0] for r in rows]

    def deal(self, limit: int) -> dict[str, str]:
        """Up to ``limit`` sessions nobody runs, each given to the least-loaded live
        node it may run on (counting those dealt before it): session -> node."""
        unowned = self._query(UNOWNED, {"n": limit})
        if not unowned:
            return {}
        loads = list(loads_of(self.nodes()).values())
        names: list[str] = []
        nodes: list[str] = []
        for name, pinned, needs, workspace, home in unowned:
            best = least_loaded(loads, from_row(pinned, needs, workspace, home))
            if best is not None:
                names.append(name)
                nodes.append(best.name)
                best.sessions += 1
        dealt = self._query(DEAL, {"names": names, "nodes": nodes})
        return {str(name): str(node) for name, node in dealt}

    def hand_over(self, name: str, to: str | None) -> str | None:
        rows = self._query(
            "UPDATE sessions AS s SET owner = t.name, epoch = s.epoch + 1 "
            "FROM (SELECT n.name FROM nodes AS n, sessions AS s WHERE n.lease_until > now() "
            "AND n.state = 'up' AND n.name <> %(me)s "
            "AND (%(to)s::text IS NULL OR n.name = %(to)s) "
            f"AND s.name = %(n)s AND {fits('n.name', 'n.labels')} "
            "ORDER BY (SELECT count(*) FROM sessions AS c WHERE c.owner = n.name), n.name "
            "LIMIT 1) AS t "
            "WHERE s.name = %(n)s AND s.owner = %(me)s RETURNING t.name",
            {"n": check_name(name), "to": to, "me": self.node},
        )
        return str(rows[0][0]) if rows else None

    def release(self, name: str) -> bool:
        rows = self._query(
            "UPDATE sessions SET owner = NULL, epoch = epoch + 1 "
            "WHERE name = %(n)s AND owner = %(me)s RETURNING name",
            {"n": name, "me": self.node},
        )
        return bool(rows)

    def target_for(self, name: str, to: str | None) -> str | None:
        rows = self._query(
            "SELECT n.name FROM nodes AS n, sessions AS s WHERE n.lease_until > now() "
            "AND n.state = 'up' AND n.name <> %(me)s "
            "AND (%(to)s::text IS NULL OR n.name = %(to)s) "
            f"AND s.name = %(n)s AND {fits('n.name', 'n.labels')} "
            "ORDER BY (SELECT count(*) FROM sessions AS c WHERE c.owner = n.name), n.name "
            "LIMIT 1",
            {"n": name, "to": to, "me": self.node},
        )
        return str(rows[0][0]) if rows else None

    def rehome(self, name: str, to: str) -> bool:
        return bool(self._query(REHOME, {"n": name, "to": to}))

    # --- placement -----------------------------------------------------------------

    def placement(self, name: str) -> tuple[Placement, str | None, bool] | None:
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

    def waiting(self) -> list[Unplaced]:
        rows = self._query(
            "SELECT s.name, s.owner, s.pinned, s.needs, s.workspace, s.workspace_node "
            "FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner "
            "WHERE s.owner IS NULL OR n.lease_until <= now() ORDER BY s.name",
            {},
        )
        out: list[Unplaced] = []
        for name, owner, pinned, needs, workspace, node in rows:
            p = from_row(pinned, needs, workspace, node)
            out.append({"name": name, "node": p.home or owner, "reason": waiting_reason(p, owner)})
        return out

    def misplaced(self) -> list[str]:
        rows = self._query(
            "SELECT s.name FROM sessions AS s WHERE s.owner = %(me)s "
            f"AND NOT {fits('%(me)s', '%(labels)s::jsonb')} ORDER BY s.name",
            {"me": self.node, "labels": self.lease.labels},
        )
        return [r[0] for r in rows]

    def movable(self) -> list[str]:
        rows = self._query(
            "SELECT name FROM sessions WHERE owner = %(me)s "
            "AND coalesce(pinned, workspace_node) IS DISTINCT FROM %(me)s ORDER BY name",
            {"me": self.node},
        )
        return [r[0] for r in rows]

    def homed_on(self, node: str) -> int:
        rows = self._query(
            "SELECT count(*) FROM sessions WHERE coalesce(pinned, workspace_node) = %(n)s",
            {"n": node},
        )
        return int(rows[0][0])
