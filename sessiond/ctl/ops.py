"""``sessionctl notify``, ``cat`` and ``trace export``: looking at the daemon from
outside (docs/design.md section 11). Plain dicts from the wire, as the rest of
sessionctl: nothing of the daemon is imported.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from sessiond.wire import Connection, RemoteError

# sessionctl commands share one signature (conn, args, out)
# ruff: noqa: ARG001


def cmd_notify(conn: Connection, args: argparse.Namespace, out: Any) -> int:
    """Each target: ok or failing, what waits, the last error. Exit 1 if one fails."""
    d = conn.call("notify", {})
    targets = d["targets"]
    if out.json:
        out.emit_json(d)
    elif not targets:
        print("no notification targets; add [[notify]] entries to the daemon's configuration")
    else:
        for t in targets:
            state = {
                "ok": "ok",
                "failing": f"FAILING ({t['failures']} attempts)",
                "stopped": "STOPPED (its delivery ended by a bug: restart the daemon)",
            }.get(t["state"], t["state"])
            print(f"{t['target']}: {state}, {t['delivered']} delivered, {t['pending']} pending")
            print(f"  url: {t['url']}")
            print(f"  events: {', '.join(t['events'])}")
            if t["last_delivered_at"]:
                print(f"  last delivered: {t['last_delivered_at']}")
            if t["last_error"]:
                print(f"  last error ({t['last_error_at']}): {t['last_error']}")
            if t["next_try_at"]:
                print(f"  next try: {t['next_try_at']}")
    return 1 if any(t["state"] != "ok" for t in targets) else 0


def cmd_cat(conn: Connection, args: argparse.Namespace, out: Any) -> int:
    d = conn.call("cat", {"name": args.name})
    if out.json:
        out.emit_json(d)
    else:
        sys.stdout.write(d["spec"] if d["spec"].endswith("\n") else d["spec"] + "\n")
    return 0


def cmd_trace(conn: Connection, args: argparse.Namespace, out: Any) -> int:
    """``trace export S [-o FILE]``: the session's spans as OTLP JSON."""
    import orjson

    d = conn.call("trace.export", {"name": args.name})
    data = orjson.dumps(d["otlp"], option=orjson.OPT_APPEND_NEWLINE)
    if args.output in (None, "-"):
        sys.stdout.buffer.write(data)
        return 0
    try:
        with open(args.output, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise RemoteError(
            "invalid_input", f"cannot write {args.output}: {exc.strerror}", 5
        ) from None
    summary = {"name": args.name, "spans": d["spans"], "output": args.output}
    if out.json:
        out.emit_json(summary)
    else:
        print(f"wrote {d['spans']} spans of {args.name} to {args.output} (OTLP JSON)")
    return 0


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    """The sub-commands of this module; ``add(name, fn, help, *positionals)``."""
    add("notify", cmd_notify, "notification targets: delivered, pending, failing (exit 1)")
    add("cat", cmd_cat, "print a session's stored spec (TOML)", "name")
    tr = add("trace", cmd_trace, "a session's trace (OpenTelemetry spans from its log)")
    tr.add_argument("action", choices=["export"])
    tr.add_argument("name")
    tr.add_argument("-o", "--output", metavar="FILE", help="write it here (default: stdout)")
