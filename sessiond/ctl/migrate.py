"""``sessionctl migrate``: a session to a runner profile, to another daemon on this
host (the two-phase hand-over, docs/design.md section 2's ``arriving``) or to another
node of a cluster (section 10)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sessiond.wire import Connection, RemoteError


def migrate(conn: Connection, args: argparse.Namespace) -> tuple[Any, str]:
    if sum(x is not None for x in (args.profile, args.to, args.node)) != 1:
        raise RemoteError("usage", "say one of --profile P, --to SOCKET or --node N", 2)
    if args.to and "://" in args.to:
        raise RemoteError(
            "usage",
            f"--to {args.to}: give the socket path of a daemon on this host; another host "
            "(ssh://) is not supported: export the session there and import it",
            2,
        )
    to = str(Path(args.to).resolve()) if args.to else None
    if args.force and args.node is None:
        raise RemoteError("usage", "--force goes with --node N (a cluster's node that is down)", 2)
    if args.node is not None:
        params: dict[str, str | bool] = {"name": args.name, "node": args.node}
        if args.force:
            params["force"] = True
        d = conn.call("migrate", params)
        if d.get("rehomed"):
            return (
                d,
                f"re-homed {args.name} from node {d.get('was')} to node {args.node}: it "
                "takes the session over now (replay, then the gate)",
            )
        return (d, f"handed {args.name} over to node {args.node}")
    d = conn.call("migrate", {"name": args.name, "profile": args.profile, "to": to})
    where = f"profile {args.profile}" if args.profile else f"the daemon at {to}"
    if d.get("handover_finished") is False:  # committed here; the target is told again
        where += " (it has not confirmed yet; it is told again until it does)"
    return (d, f"migrated {args.name} to {where}")
