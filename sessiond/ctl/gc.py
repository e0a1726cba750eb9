"""``sessionctl gc [--dry-run]``: apply the daemon's ``[retention]`` now (docs/design.md
section 6) and say what was removed (or would be) and the bytes freed."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sessiond.wire import Connection


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # not reached


def cmd_gc(conn: Connection, args: argparse.Namespace, out: Any) -> int:
    r = conn.call("gc", {"dry_run": bool(args.dry_run)})
    if out.json:
        out.emit_json(r)
        return 1 if r["errors"] else 0
    if not r["rules"]:
        print(
            "gc: no [retention] rule is set in the daemon's configuration, so nothing is "
            "removed; set terminated, unreferenced, keep_artifacts or snapshots there "
            "(docs/retention.md), then 'sessionctl reload'"
        )
        return 0
    verb = "would remove" if r["dry_run"] else "removed"
    for s in r["sessions"]:
        rules: dict[str, int] = {}
        for a in s["artifacts"]:
            rules[a["rule"]] = rules.get(a["rule"], 0) + 1
        why = ", ".join(f"{n} {rule}" for rule, n in sorted(rules.items()))
        print(
            f"{s['name']}: {verb} {len(s['artifacts'])} artifact(s)"
            + (f" ({why})" if why else "")
            + f", {len(s['snapshots'])} snapshot(s), {_size(s['bytes'])}"
        )
    freed = "would free" if r["dry_run"] else "freed"
    print(
        f"gc: {verb} {r['artifacts']} artifact(s) and {r['snapshots']} snapshot(s) from "
        f"{len(r['sessions'])} session(s); {freed} {_size(r['bytes'])} "
        f"(rules: {'; '.join(r['rules'])})"
    )
    for error in r["errors"]:
        print(f"not collected: {error}")
    return 1 if r["errors"] else 0


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    gc = add("gc", cmd_gc, "apply [retention] now: remove old evidence, report the bytes freed")
    gc.add_argument(
        "--dry-run", action="store_true", help="say what would be removed; remove nothing"
    )
