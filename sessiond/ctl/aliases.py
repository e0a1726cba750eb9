"""``start``, ``stop``, ``restart``: the verbs of systemctl, made of sessiond's own.

- ``start S``: run it now. A suspended session is resumed first (``resume``), then
  woken (``activate``); one running already is left running (exit 0, as systemctl).
- ``stop S``: ``suspend``: its program is stopped and no wake runs it until
  ``start`` or ``resume``. (``interrupt`` stops only the current run: its triggers
  still wake it, as a timer starts a stopped unit again.) A suspended one: exit 0.
- ``restart S``: the current run stopped (``interrupt``), a suspended one resumed,
  then woken now (``activate``).

Each step is the syscall of that name, with its checks: a blocked or terminated
session is refused with the reason those give.

``activate``, ``start`` and ``restart`` take ``--wait``: return once the run they
started has finished, with its outcome as the exit code (sessiond.ctl.waiting).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sessiond.ctl.render import Out
from sessiond.ctl.waiting import ended, the_run
from sessiond.wire import Connection

# the reply types, for mypy only: sessionctl starts without building them
if TYPE_CHECKING:
    from sessiond.replies import SessionDetail


def add_parsers(add: Any) -> None:
    add_wait(add("start", cmd_start, "run it now: resume if suspended, then activate", "name"))
    add("stop", cmd_stop, "suspend: stop its program; no wake runs it until start", "name")
    add_wait(add("restart", cmd_restart, "stop the current run, then run it again now", "name"))


def add_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        action="store_true",
        help="return when the run it started has finished: exit 0 if it finished ok, "
        "1 if not (as systemctl start --wait)",
    )


def _said(out: Out, d: SessionDetail, text: str, conn: Connection | None = None) -> int:
    """Print the answer; with ``--wait`` (``conn`` given), then wait for the run the
    command started and say how it ended."""
    if out.json:
        out.emit_json(d)
    else:
        print(text + (f" ({d['reason']})" if d.get("reason") else ""), flush=True)
    run = the_run(d) if conn is not None else None
    if conn is None or run is None:
        return 0
    line, code = ended(conn, d["name"], run)
    if not out.json:  # --json prints the one answer above, and the exit code says the rest
        print(line)
    return code


def cmd_activate(conn: Connection, args: argparse.Namespace, out: Out) -> int:
    d = conn.call("activate", {"name": args.name})
    waits = conn if args.wait else None
    return _said(out, d, f"activated {d['name']}: {d['state']}", waits)


def _run_now(conn: Connection, name: str, d: SessionDetail) -> SessionDetail:
    if d["state"] == "suspended":
        d = conn.call("resume", {"name": name})
    if d["state"] != "running":  # a resume with pending wakes may have started it
        d = conn.call("activate", {"name": name})
    return d


def cmd_start(conn: Connection, args: argparse.Namespace, out: Out) -> int:
    d = conn.call("show", {"name": args.name})
    if d["state"] == "running":
        return _said(out, d, f"{args.name} is running already", conn if args.wait else None)
    d = _run_now(conn, args.name, d)
    return _said(out, d, f"started {args.name}: {d['state']}", conn if args.wait else None)


def cmd_stop(conn: Connection, args: argparse.Namespace, out: Out) -> int:
    d = conn.call("show", {"name": args.name})
    if d["state"] == "suspended":
        return _said(out, d, f"{args.name} is stopped already (suspended)")
    d = conn.call("suspend", {"name": args.name})
    return _said(out, d, f"stopped {args.name}: {d['state']}")


def cmd_restart(conn: Connection, args: argparse.Namespace, out: Out) -> int:
    d = conn.call("show", {"name": args.name})
    if d["state"] == "running":
        d = conn.call("interrupt", {"name": args.name})
    d = _run_now(conn, args.name, d)
    return _said(out, d, f"restarted {args.name}: {d['state']}", conn if args.wait else None)
