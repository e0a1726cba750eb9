"""``sessionctl output`` and ``status``: what a run printed, and a session at a glance.

``output S`` is supervisorctl's ``tail`` / ``journalctl -u`` for a session: the
newest run's stdout (``--stderr``: its stderr; ``--run r3``: that run's; ``-n N``:
the last N lines). ``-f`` follows it as it is printed and then the runs after it,
like ``tail -F``, until Ctrl-C. The daemon answers each request once (a long
poll: sessiond.syscalls.output), so following is a loop of ordinary requests.

``status S`` is ``systemctl status``: ``show``, then the last events of its log
and the last lines its newest run printed.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from sessiond.wire import Connection, RemoteError

# the reply types, for mypy only: sessionctl starts without building them
if TYPE_CHECKING:
    from sessiond.replies import Output

POLL = 25.0  # seconds one follow request may wait (the daemon allows 30)
STATUS_EVENTS = 10
STATUS_LINES = 5

# a sessionctl command: (connection, arguments, output) -> exit code
Command = Callable[[Connection, argparse.Namespace, Any], int]


class OutputRequest(TypedDict):
    """An ``output`` request's params (docs/rpc.md); sessionctl adds the rest per ask."""

    name: str
    stream: str
    run: NotRequired[str | None]
    offset: NotRequired[int]
    wait: NotRequired[float]
    after: NotRequired[str]


def tail(text: str, lines: int | None) -> str:
    """The last ``lines`` lines of ``text`` (all of it for None)."""
    if lines is None:
        return text
    if lines <= 0:
        return ""
    kept = text.splitlines(keepends=True)[-lines:]
    return "".join(kept)


def _params(args: argparse.Namespace) -> OutputRequest:
    return {"name": args.name, "stream": "stderr" if args.stderr else "stdout"}


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def cmd_output(conn: Connection, args: argparse.Namespace, out: Any) -> int:
    if args.lines is not None and args.lines < 0:
        raise RemoteError("usage", f"-n/--lines {args.lines}: give a count of 0 or more", 2)
    base = _params(args)
    if not args.follow:
        r = _whole(conn, {**base, "run": args.run})
        if out.json:
            out.emit_json({**r, "data": tail(r["data"], args.lines)})
            return 0
        _write(tail(r["data"], args.lines))
        if not r["data"]:
            _nothing(conn, base, r)
        return 0
    conn.sock.settimeout(None)
    try:
        return _follow(conn, base, args, out)
    except KeyboardInterrupt:
        return 0


def _whole(conn: Connection, params: OutputRequest, first: Output | None = None) -> Output:
    """One run's text as it is now, asked for a chunk at a time (``more``);
    ``first``: the answer already in hand."""
    r: Output = first if first is not None else conn.call("output", params)
    start, parts = r["offset"], [r["data"]]
    while r.get("more"):
        ask = {**params, "run": r["run"], "offset": r["next_offset"], "wait": 0.0}
        r = conn.call("output", ask)
        parts.append(r["data"])
    whole = r.copy()
    whole["data"], whole["offset"] = "".join(parts), start
    return whole


def _nothing(conn: Connection, base: OutputRequest, r: Output) -> None:
    """Say why nothing was printed (on stderr: stdout stays the run's own)."""
    stream = base["stream"]
    if r["running"]:
        note = f"run {r['run']} is running and has printed no whole line on {stream} yet"
    else:
        note = f"run {r['run']} printed nothing on {stream}"
        other = "stderr" if stream == "stdout" else "stdout"
        o = _whole(conn, {**base, "stream": other, "run": r["run"]})
        if o["data"]:
            flag = "--stderr" if other == "stderr" else "without --stderr"
            note += f"; its {other} has {len(o['data'].splitlines())} line(s) ({flag})"
    print(f"sessionctl: {note}", file=sys.stderr)


def _follow(conn: Connection, base: OutputRequest, args: argparse.Namespace, out: Any) -> int:
    run: str | None = args.run
    first = True
    offset = 0
    while True:
        if run is None:  # the newest run, when there is one (or wait for the first)
            r = conn.call("output", {**base, "wait": POLL})
        else:
            r = conn.call("output", {**base, "run": run, "offset": offset, "wait": POLL})
        if r["run"] is None:  # no run yet: wait on
            first = False
            continue
        r = _whole(conn, base, r)
        data = tail(r["data"], args.lines) if first and r["offset"] == 0 else r["data"]
        first = False
        _emit(out, r, data)
        run, offset = r["run"], r["next_offset"]
        if r["running"]:
            continue
        if args.run is not None:  # that run has ended: nothing more of it will come
            return 0
        assert run is not None  # the answer named its run (it had one, above)
        nxt = _whole(conn, base, _next_run(conn, base, run))
        print(f"sessionctl: run {nxt['run']} started", file=sys.stderr, flush=True)
        _emit(out, nxt, nxt["data"])
        run, offset = nxt["run"], nxt["next_offset"]


def _next_run(conn: Connection, base: OutputRequest, after: str) -> Output:
    while True:
        r: Output = conn.call("output", {**base, "after": after, "wait": POLL})
        if r["run"] is not None:
            return r


def _emit(out: Any, r: Output, data: str) -> None:
    if out.json:
        out.emit_json({**r, "data": data})
        sys.stdout.flush()
    else:
        _write(data)


def cmd_status(conn: Connection, args: argparse.Namespace, out: Any, *, show: Command) -> int:
    """``show`` (the command ``show``, given by sessiond.ctl, which imports this
    module), the last events, the last lines of the newest run's output."""
    from sessiond.ctl.logcmd import event_line

    if out.json:
        d = conn.call("show", {"name": args.name})
        log = conn.call("log", {"name": args.name, "limit": STATUS_EVENTS})
        output = _newest(conn, args.name)
        out.emit_json({"show": d, "log": log, "output": output})
        return 0
    show(conn, args, out)
    log = conn.call("log", {"name": args.name, "limit": STATUS_EVENTS})
    print(f"\nlast {len(log)} event(s) (sessionctl log {args.name}):")
    for record in log:
        print("  " + event_line(record, out))
    output = _newest(conn, args.name)
    if output is None:
        print("\nno run yet: no output")
        return 0
    lines = tail(output["data"], STATUS_LINES)
    doing = "running" if output["running"] else output.get("status", "ended")
    print(
        f"\nlast lines of run {output['run']} ({doing}) on stdout (sessionctl output {args.name}):"
    )
    print("".join(f"  {line}" for line in lines.splitlines(keepends=True)).rstrip("\n") or "  -")
    return 0


def _newest(conn: Connection, name: str) -> Output | None:
    try:
        r = _whole(conn, {"name": name, "stream": "stdout"})
    except RemoteError as exc:
        if "has not run yet" in exc.message:
            return None
        raise
    return r


def add_parsers(add: Callable[..., argparse.ArgumentParser], show: Command) -> None:
    op = add(
        "output",
        cmd_output,
        "a run's stdout (the newest run's; -f follows it and the runs after it)",
        "name",
    )
    op.add_argument("-f", "--follow", action="store_true", help="follow as it is printed, and "
                    "the next runs (Ctrl-C ends)")  # fmt: skip
    op.add_argument("--run", metavar="RUN", help="that run (r1, r2, ...); default: the newest")
    op.add_argument("--stderr", action="store_true", help="the run's stderr instead")
    op.add_argument("-n", "--lines", type=int, metavar="N", help="only the last N lines")
    status = functools.partial(cmd_status, show=show)
    add("status", status, "show, then the last log events and the newest run's output", "name")
