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
    """The ``nodes`` answer as a table; this node is marked with ``*``."""
    table = [["NODE", "INCARNATION", "STATE", "LEASE AGE", "LEASE LEFT", "SESSIONS"]]
    for r in rows:
        table.append(
            [
                r["name"] + (" *" if r.get("self") else ""),
                str(r["incarnation"]),
                r["state"],
                f"{r['lease_age_s']:.1f}s",
                f"{r['lease_left_s']:.1f}s",
                str(r["sessions"]),
            ]
        )
    return table


def drain(conn: Connection, args: argparse.Namespace) -> tuple[Any, str]:
    """``sessionctl drain N``: node N hands its sessions to the others, a few a second."""
    d = conn.call("drain", {"name": args.name})
    text = f"draining node {d['node']}: {d['sessions']} sessions to move"
    if d.get("staying"):  # pinned there, or with a workspace only there
        text += f"; {d['staying']} stay (pinned to it, or their workspace is only there)"
    return d, text
