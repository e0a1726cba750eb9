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
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sessiond.ctl.render import Out
from sessiond.wire import Connection

# the reply types, for mypy only: sessionctl starts without building them
if TYPE_CHECKING:
    from sessiond.replies import SessionDetail


def add_parsers(add: Any) -> None:
    add("start", cmd_start, "run it now: resume if suspended, then activate", "name")
    add("stop", cmd_stop, "suspend: stop its program; no wake runs it until start", "name")
    add("restart", cmd_restart, "stop the current run, then run it again now", "name")


def _said(out: Out, d: SessionDetail, text: str) -> int:
    if out.json:
        out.emit_json(d)
    else:
        print(text + (f" ({d['reason']})" if d.get("reason") else ""))
    return 0


def _run_now(conn: Connection, name: str, d: SessionDetail) -> SessionDetail:
    if d["state"] == "suspended":
        d = conn.call("resume", {"name": name})
    if d["state"] != "running":  # a resume with pending wakes may have started it
        d = conn.call("activate", {"name": name})
    return d


def cmd_start(conn: Connection, args: argparse.Namespace, out: Out) -> int:
    d = conn.call("show", {"name": args.name})
    if d["state"] == "running":
        return _said(out, d, f"{args.name} is running already")
    d = _run_now(conn, args.name, d)
    return _said(out, d, f"started {args.name}: {d['state']}")


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
    return _said(out, d, f"restarted {args.name}: {d['state']}")
