"""``sessionctl log``: a session's events, or every session's, as journalctl shows a unit's.

Output (``-o``), as journalctl names them:

- ``short`` (the default): one line per event, seq, time, type and what happened;
- ``cat``: what happened alone;
- ``json``: one JSON array of the events (not with ``-f``: an array has an end);
- ``json-lines``: one JSON object per line, with or without ``-f``.

``--json`` stays: it is ``-o json`` without ``-f`` and ``-o json-lines`` with it.
``today`` and ``yesterday`` are made absolute here, at this machine's midnight,
before they are sent (the daemon may run in another time zone); a duration
(``1h``, ``-1h``) is sent as it is and counts back from the daemon's clock, which
stamps the events.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from sessiond.ctl.render import Out
from sessiond.ctl.safeterm import safe_text
from sessiond.wire import Connection, RemoteError

# for mypy only: sessionctl log loads logquery when it runs, and the reply types
# are never built at run time (sessionctl's start-up is part of its contract)
if TYPE_CHECKING:
    from sessiond.codec import EventRecord
    from sessiond.logquery import LogRequest

FORMATS = ("short", "cat", "json", "json-lines")
ALL_PAGE = 5000  # sessions asked for at once by ``log --all`` (one ``ps``)


def add_parser(add: Any) -> None:
    lg = add("log", cmd_log, "a session's events, or every session's (-f streams new ones)")
    lg.add_argument("name", nargs="?", help="the session (or --all)")
    lg.add_argument("--since", default="1", metavar="SEQ|TIME",
                    help="from a seq (42), a time back from now (10m, -2h), today, "
                    "yesterday, or an RFC 3339 time")  # fmt: skip
    lg.add_argument("--until", metavar="TIME",
                    help="up to a time: 10m, -2h, today, yesterday, now or RFC 3339 "
                    "(not with -f)")  # fmt: skip
    lg.add_argument(
        "--type", action="append", metavar="TYPE", help="only this event type (repeatable)"
    )
    lg.add_argument("--grep", metavar="REGEX", help="only events whose line or data match")
    lg.add_argument("-n", "--lines", "--limit", dest="limit", type=int, default=0, metavar="N",
                    help="only the last N (with -f: then follow)")  # fmt: skip
    lg.add_argument("-f", "--follow", action="store_true", help="stream new events until Ctrl-C")
    lg.add_argument("--all", action="store_true",
                    help="every session, merged in time order (with -f: as they come)")  # fmt: skip
    lg.add_argument("-o", "--output", choices=FORMATS, metavar="FORMAT",
                    help="short (default), cat, json (one array; not with -f) or "
                    "json-lines (an object per line); --json is json, or json-lines "
                    "with -f")  # fmt: skip


def output_format(args: argparse.Namespace) -> str:
    if args.output is not None:
        return str(args.output)
    if getattr(args, "json", False):
        return "json-lines" if args.follow else "json"
    return "short"


def params(args: argparse.Namespace) -> LogRequest:
    """The ``log`` request of the command line; a bad --since, --until, --grep, -n or
    -o is a usage error here (exit 2), before anything is sent."""
    from sessiond.logquery import DAYS, absolute, compile_grep, parse_since, parse_until

    if not args.all and not args.name:
        raise RemoteError("usage", "log: name a session, or use --all", 2)
    if args.all and args.name:
        raise RemoteError("usage", f"log: --all or a session ({args.name}), not both", 2)
    if args.limit < 0:
        raise RemoteError("usage", f"log: -n/--lines {args.limit}: give a count of 0 or more", 2)
    if args.follow and args.output == "json":
        raise RemoteError(
            "usage", "log: -o json is one array and cannot be followed; use -o json-lines", 2
        )
    if args.follow and args.until is not None:
        raise RemoteError("usage", "log: --until ends the window; it does not go with -f", 2)
    now = time.time_ns()
    text = args.since.strip()
    since: int | str = int(text) if text.isdigit() else text  # digits: a seq; else a time
    if isinstance(since, int) and since >= 1 << 63:
        raise RemoteError("usage", f"log: --since {text}: no log has that many events", 2)
    until = args.until
    try:
        parse_since(since, now)
        parse_until(until, now)
        # today/yesterday: this machine's midnight; a duration stays relative to the
        # daemon's clock, which stamps the events (docs/rpc.md)
        if isinstance(since, str) and since.strip() in DAYS:
            since = absolute(since, now) or since
        if until is not None and until.strip() in DAYS:
            until = absolute(until, now, what="until") or until
    except ValueError as exc:
        raise RemoteError("usage", f"log: --{exc}", 2) from None  # "since 'x' is not …"
    try:
        compile_grep(args.grep)
    except ValueError as exc:
        raise RemoteError("usage", f"log: {exc}", 2) from None
    request: LogRequest = {
        "name": None if args.all else args.name,
        "since": since,
        "types": args.type or [],
        "limit": args.limit,
        "grep": args.grep,
        "follow": args.follow,
    }
    if until is not None:
        request["until"] = until
    return request


def event_line(record: EventRecord, out: Out, with_session: bool = False) -> str:
    from sessiond.describe import describe

    who = f"{record['session']:<16} " if with_session else ""
    kind = out.paint(f"{record['type']:<22}", "1")
    return f"{who}{record['seq']:>6}  {record['ts']}  {kind} {describe(record)}".rstrip()


def _print(record: EventRecord, fmt: str, out: Out, with_session: bool) -> None:
    if fmt == "json-lines":
        out.emit_json(record)
    elif fmt == "cat":
        from sessiond.describe import describe

        print(describe(record))
    else:
        print(event_line(record, out, with_session))


def _every_session(conn: Connection, request: LogRequest) -> list[EventRecord]:
    """``log --all`` without ``-f``: each session's matching events (each asked of
    the node that runs it, in a cluster), merged in time order; ``-n`` then keeps
    the last N of the whole."""
    names = [r["name"] for r in conn.call("ps", {"all": True, "sort": "name"})]
    merged: list[EventRecord] = []
    for name in names:
        try:
            merged.extend(conn.call("log", {**request, "name": name}))
        except RemoteError as exc:
            if exc.code == "node_unavailable":  # a cluster's node down: say so, go on
                note = safe_text(f"{name} left out: {exc.message}")
                print(f"sessionctl: {note}", file=sys.stderr)
            elif exc.exit_code != 4:  # a session gone meanwhile is no error
                raise
    merged.sort(key=lambda r: (r["ts"], r["session"], r["seq"]))
    limit = request["limit"]
    return merged[-limit:] if limit else merged


def cmd_log(conn: Connection, args: argparse.Namespace, out: Out) -> int:
    from sessiond.logquery import follow

    request = params(args)
    fmt = output_format(args)
    if not args.follow:
        records = _every_session(conn, request) if args.all else conn.call("log", request)
        if fmt == "json":
            out.emit_json(records)
        else:
            for r in records:
                _print(r, fmt, out, with_session=args.all)
        return 0
    conn.sock.settimeout(None)
    try:
        # follow() catches up from the log when the daemon says this reader fell behind
        for record in follow(conn, request):
            _print(record, fmt, out, with_session=args.all)
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0
