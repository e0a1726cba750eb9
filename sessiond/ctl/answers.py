"""``sessionctl approve``, ``deny``, ``resolve`` and ``apply``: a person's answers
and actions (docs/design.md section 8, "Who may approve").

The daemon records who gave each from the connection's peer credentials (uid,
user name, channel); ``--by`` is only a free-text note kept beside that. A
session's program cannot use these: the control socket serves a run's
processes nothing but ``ping``, and the program endpoint never serves them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from sessiond.wire import RemoteError

# the reply types and typing, for mypy only: sessionctl starts without them
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from sessiond.replies import Folded, PsRow, SessionDetail
    from sessiond.wire import Connection

    Answer = Callable[[Connection, argparse.Namespace], tuple[Any, str]]
NOTE = "a free-text note recorded beside who answered (which the daemon takes from the socket)"


def approve(conn: Connection, args: argparse.Namespace) -> tuple[Any, str]:
    d = conn.call("approve", {"name": args.name, "call": args.call, "by": args.by or ""})
    return d, f"approved for {args.name}: {d['state']}"


def deny(conn: Connection, args: argparse.Namespace) -> tuple[Any, str]:
    params = {"name": args.name, "call": args.call, "by": args.by or "", "reason": args.reason}
    d = conn.call("deny", params)
    return d, f"denied for {args.name}: {d['state']}"


def resolve(conn: Connection, args: argparse.Namespace) -> tuple[Any, str]:
    d = conn.call("resolve", {"name": args.name, "option": args.option, "by": args.by or ""})
    reason = f" ({d['reason']})" if d.get("reason") else ""
    return d, f"resolved {args.name} with --{args.option}: {d['state']}{reason}"


def apply(conn: Connection, args: argparse.Namespace) -> tuple[Any, str]:
    from pathlib import Path

    path = Path(args.spec)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RemoteError("invalid_input", f"cannot read {path}: {exc.strerror}", 5) from exc
    except UnicodeDecodeError as exc:
        raise RemoteError("invalid_input", f"{path} is not UTF-8 text", 5) from exc
    params = {
        "name": args.name,
        "spec": text,
        "base": str(path.resolve().parent),
        "source": str(path),
        "by": args.by or "",
    }
    d = conn.call("apply", params)
    return d, f"applied {path} to {args.name}: {d['state']}"


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    """The answers' sub-commands; ``add(name, answer, help, *positionals)``."""
    ap = add("approve", approve, "grant a pending approval", "name")
    ap.add_argument("--call", metavar="CALL")
    ap.add_argument("--by", metavar="NOTE", help=NOTE)
    dn = add("deny", deny, "deny a pending approval", "name")
    dn.add_argument("--call", metavar="CALL")
    dn.add_argument("--by", metavar="NOTE", help=NOTE)
    dn.add_argument("--reason", default="", metavar="TEXT")
    rs = add("resolve", resolve, "apply a recovery option to a blocked session, then gate again "
             "(one that would change nothing is refused: 'sessionctl gate' lists those that "
             "would)", "name")  # fmt: skip
    option = rs.add_mutually_exclusive_group(required=True)
    for name, help_text in (
        ("rerun", "run the half-finished step again"),
        ("discard", "drop the pending step, recorded as abandoned"),
        ("accept", "accept the workspace as it is now (record its hashes)"),
    ):
        option.add_argument(
            f"--{name}", dest="option", action="store_const", const=name, help=help_text
        )
    rs.add_argument("--by", metavar="NOTE", help=NOTE)
    ay = add("apply", apply, "give a live session a new spec or policy (recorded)", "name", "spec")
    ay.add_argument("--by", metavar="NOTE", help=NOTE)


def who(answer: Folded) -> str:
    """'by ann (uid 1000, cli)': who answered, from the socket or the web login;
    the note after it."""
    uid = f"uid {answer['uid']}, " if answer.get("uid") is not None else ""
    channel = "a signed link" if answer.get("channel") == "link" else answer.get("channel")
    who = (
        f"by {answer['user']} ({uid}{channel or 'no channel recorded'})"
        if answer.get("user")
        else "by an unrecorded person"
    )
    return who + (f", note: {answer['by']}" if answer.get("by") else "")


BOUNDARY_OFF = (
    'sessionctl: the boundary is off ([run] sandbox = "off" in the daemon\'s configuration): '
    "runs are not confined"
)


def say_unconfined(rows: list[PsRow]) -> None:
    if any(r.get("boundary") == "off" for r in rows):
        print(BOUNDARY_OFF, file=sys.stderr)


def boundary(d: SessionDetail) -> str:
    """``show``'s boundary line: the sandbox (its network, the session's uid) or off."""
    b = d.get("boundary")
    if not b:
        return "-"
    if b.get("sandbox") == "off":
        return 'off: runs are not confined ([run] sandbox = "off")'
    uid = f", uid {b['uid']}" if b.get("uid") is not None else ""
    return f"sandbox (network {b.get('network') or 'host'}{uid})"
