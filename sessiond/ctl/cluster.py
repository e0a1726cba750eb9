"""``sessionctl nodes``, ``drain`` and ``migrate --node``: a cluster's nodes
(docs/design.md section 10), as people read them."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sessiond.wire import Connection

# the reply types, for mypy only: sessionctl starts without building them
if TYPE_CHECKING:
    from sessiond.replies import NodeRow


def nodes_table(rows: list[NodeRow]) -> list[list[str]]:
    """The ``nodes`` answer as a table; this node is marked with ``*``. SHARE is
    the sessions it should hold (its fair share) and how many it holds against
    that; RUNNING, READY and SLOTS its load (programs running, sessions waiting
    for a slot, its max_running)."""
    head = ["NODE", "INCARNATION", "STATE", "LEASE AGE", "LEASE LEFT", "SESSIONS", "SHARE"]
    table = [[*head, "RUNNING", "READY", "SLOTS"]]
    for r in rows:
        table.append(
            [
                r["name"] + (" *" if r.get("self") else ""),
                str(r["incarnation"]),
                r["state"],
                f"{r['lease_age_s']:.1f}s",
                f"{r['lease_left_s']:.1f}s",
                str(r["sessions"]),
                _share(r),
                *(
                    (str(r["running"]), str(r["ready"]), str(r["max_running"] or "-"))
                    if r["alive"]
                    else ("-", "-", "-")
                ),
            ]
        )
    return table


def _share(r: NodeRow) -> str:
    """The fair share and the sessions held against it ("10.0 (120%)"); "-" for a
    node that takes no sessions (down or draining)."""
    share = r.get("share", 0.0)
    if not r["alive"] or r["state"] != "up":
        return "-"
    if share <= 0:
        return "0"
    return f"{share:.1f} ({100 * r['sessions'] / share:.0f}%)"


def drain(conn: Connection, args: argparse.Namespace) -> tuple[Any, str]:
    """``sessionctl drain N``: node N hands its sessions to the others, a few a second."""
    d = conn.call("drain", {"name": args.name})
    text = f"draining node {d['node']}: {d['sessions']} sessions to move"
    if d.get("staying"):  # pinned there, or with a workspace only there
        text += f"; {d['staying']} stay (pinned to it, or their workspace is only there)"
    return d, text
