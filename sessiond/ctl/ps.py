"""``sessionctl ps`` and ``top``: the process table, filtered and sorted by the daemon.

The filters travel to the daemon (sessiond.listing has the rules both ends
use), so a table of thousands of sessions is cut there, not here. Cells are cut
only on a terminal, and then with an ellipsis; piped, or with ``--full``, every
cell is whole, so ``grep`` and ``awk`` see the real reason.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from sessiond.ctl.answers import say_unconfined
from sessiond.ctl.render import Out, ago, cut, table, when
from sessiond.listing import DEFAULT_SORT, HIDE_TERMINATED_AFTER, SORTS, Listing, PsRequest
from sessiond.wire import Connection, RemoteError

# the reply types and typing, for mypy only: sessionctl starts without them
# (argparse too: a plain `sessionctl ps` is read without it, sessiond/ctl/__init__.py)
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from sessiond.replies import PsRow

    Add = Callable[..., argparse.ArgumentParser]


def add_parsers(add: Add) -> None:
    ps = add("ps", cmd_ps, "the process table: sessions, their state and next wake")
    _options(ps)
    ps.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="refresh the table every SECONDS (default 2) until Ctrl-C",
    )
    top = add("top", cmd_ps, "ps --watch: a refreshing table of sessions")
    _options(top)
    top.set_defaults(watch=2.0)


def _options(p: argparse.ArgumentParser) -> None:
    hours = f"{HIDE_TERMINATED_AFTER / 3600:g} h"
    p.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="STATE[,STATE]",
        help="only sessions in this state (repeatable, or a comma list); "
        "naming terminated lists every terminated one",
    )
    p.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="AGENT",
        help="only sessions of this owning agent (repeatable)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only sessions whose spec has this label (repeatable: all match)",
    )
    p.add_argument(
        "-a",
        "--all",
        action="store_true",
        help=f"also sessions terminated more than {hours} ago (else hidden)",
    )
    p.add_argument(
        "--sort",
        choices=SORTS,
        default=DEFAULT_SORT,
        help="the order: agent (default: grouped by owning agent, then name), "
        "name, state (blocked first), last-active (latest first), priority "
        "(highest first)",
    )
    p.add_argument(
        "-l",
        "--full",
        action="store_true",
        help="never cut a cell (cells are cut, with …, only on a terminal)",
    )


def params(args: argparse.Namespace) -> PsRequest:
    """The ``ps`` request; a bad --state or --label is a usage error (exit 2)."""
    try:
        listing = Listing.of(args.state, args.agent, args.label, args.all, args.sort)
    except ValueError as exc:
        raise RemoteError("usage", f"ps: --{exc}", 2) from None
    return {**listing.params(), "footer": True}


def cmd_ps(conn: Connection, args: argparse.Namespace, out: Out) -> int:
    request = params(args)
    if getattr(args, "watch", None):
        return _watch(conn, args, out, request)
    answer = conn.call("ps", request)
    rows, hidden = answer["rows"], answer["hidden"]
    if out.json:
        out.emit_json(rows)  # the rows alone, as always: a script's array
        return 0
    say_unconfined(rows)  # on stderr, where the sandbox is off
    full = args.full or not sys.stdout.isatty()
    if rows:
        table(rows_table(rows, full), out, colour_col=None)
    elif hidden or any(request[k] for k in ("state", "agent", "label")):
        print("no sessions match")
    else:
        print("no sessions; create one with 'sessionctl create SPEC.toml'")
    if hidden:
        print(footer(hidden))
    return 0


def footer(hidden: int) -> str:
    hours = f"{HIDE_TERMINATED_AFTER / 3600:g} h"
    sessions = "session" if hidden == 1 else "sessions"
    return (
        f"{hidden} terminated {sessions} hidden (terminated more than {hours} ago); "
        "--all shows them"
    )


def rows_table(rows: list[PsRow], full: bool) -> list[list[str]]:
    head = ["NAME", "STATE", "AGENT", "PRI", "LAST ACTIVE", "NEXT WAKE", "RUNS", "REASON"]
    nodes = any("node" in r for r in rows)  # a cluster node: which node runs each
    head[1:1] = ["NODE"] if nodes else []
    cells = [head]
    for r in rows:
        state = r["state"] + (f"({r['outcome']})" if r.get("outcome") else "")
        cells.append(
            [
                r["name"],
                *([r.get("node") or "-"] if nodes else []),
                state,
                r["agent"] or "-",
                str(r["priority"]),
                ago(r["last_active"]),
                cut(when(r["next_wake"]), 40, full),
                str(r["runs"]),
                cut(r["reason"] or "", 60, full),
            ]
        )
    return cells


def _watch(conn: Connection, args: argparse.Namespace, out: Out, request: PsRequest) -> int:
    """`ps --watch` / `top`: the table, refreshed, with each session's latest wake."""
    interval = float(args.watch)
    try:
        while True:
            answer = conn.call("ps", request)
            rows = answer["rows"]
            lines = [f"sessiond: {len(rows)} sessions — {time.strftime('%H:%M:%S')} "
                     f"(every {interval:g}s, Ctrl-C quits)", ""]  # fmt: skip
            if out.colour:
                sys.stdout.write("\033[H\033[2J")
            print("\n".join(lines))
            if rows:
                nodes = any("node" in r for r in rows)  # a NODE column before STATE
                table(rows_table(rows, args.full), out, colour_col=2 if nodes else 1)
            if answer["hidden"]:
                print(footer(answer["hidden"]))
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
