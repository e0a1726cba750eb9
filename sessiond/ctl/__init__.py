"""``sessionctl``: the command-line client of sessiond.

Lean on purpose: plain dicts and the standard library's json, no import of the
daemon's models (it is run by scripts and people all day; start-up time matters).
A command imports what it uses when it runs: a plain command line is read without
argparse (PLAIN), any other with its own command's parser alone (OneCommand); its
module is imported alone, and orjson, typing, pathlib and datetime come only with the
commands that use them (tests/e2e/test_lean_client.py holds this).
Exit codes: 0 done; 1 refused; 2 usage error; 3 daemon not reachable; 4 no such
session; 5 invalid input; 6 a cluster's database not reachable; 70 internal error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from sessiond import __version__
from sessiond.ctl.render import Out
from sessiond.paths import socket_path
from sessiond.wire import Connection, RemoteError

# the reply types and typing, for mypy only: sessionctl starts without them (and
# without argparse, for a plain command line: see PLAIN)
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from argparse import Namespace
    from pathlib import Path
    from typing import Any

    from sessiond.ctl import answers
    from sessiond.ctl.parsing import Parser

    Command = Callable[[Connection, argparse.Namespace, Out], int]
else:  # what argparse's Namespace is to the commands: their arguments as attributes
    from types import SimpleNamespace as Namespace

# --- commands ---------------------------------------------------------------------


def cmd_show(conn: Connection, args: Namespace, out: Out) -> int:
    d = conn.call("show", {"name": args.name})
    if out.json:
        out.emit_json(d)
        return 0
    from sessiond.ctl.detail import print_detail

    print_detail(d, out)
    if d["state"] == "blocked":  # why, and exactly the answers that change it
        from sessiond.ctl import recover

        for key, value in recover.recover_lines(conn.call("gate", {"name": args.name})):
            print(f"{key.rjust(11)}: {value}")
    return 0


def cmd_replay(conn: Connection, args: Namespace, out: Out) -> int:
    params = {"name": args.name, "upto": args.upto, "view": args.view}
    if args.view == "messages":
        from sessiond.ctl.pages import replay_messages

        return replay_messages(conn, params, out.json, out.emit_json)
    view = conn.call("replay", params)
    if out.json or args.view == "state":
        out.emit_json(view)
    elif args.view == "messages":
        for m in view:
            print(f"{m['role']:>9}: {m['content']}")
    else:
        print("\n".join(view))
    return 0


def cmd_gate(conn: Connection, args: Namespace, out: Out) -> int:
    report = conn.call("gate", {"name": args.name})
    if out.json:
        out.emit_json(report)
    else:
        from sessiond.ctl import recover

        print("\n".join(recover.gate_text(report, out.paint)))
    return 0 if report["ok"] else 1


def cmd_create(conn: Connection, args: Namespace, out: Out) -> int:
    from pathlib import Path

    path = Path(args.spec)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RemoteError("invalid_input", f"cannot read {path}: {exc.strerror}", 5) from exc
    except UnicodeDecodeError as exc:
        raise RemoteError("invalid_input", f"{path} is not UTF-8 text", 5) from exc
    d = conn.call("create", {"spec": text, "base": str(path.resolve().parent), "source": str(path)})
    moved = f", handed to node {d['handed_to']}" if d.get("handed_to") else ""  # placement
    return _done(d, out, f"created {d['name']}: {d['state']}{moved}")


def _simple(method: str, verb: str) -> Command:
    def run(conn: Connection, args: Namespace, out: Out) -> int:
        d = conn.call(method, {"name": args.name})
        return _done(
            d,
            out,
            f"{verb} {d['name']}: {d['state']}" + (f" ({d['reason']})" if d.get("reason") else ""),
        )

    return run


def _done(result: Any, out: Out, text: str) -> int:
    if out.json:
        out.emit_json(result)
    else:
        print(text)
    return 0


def cmd_fork(conn: Connection, args: Namespace, out: Out) -> int:
    d = conn.call(
        "fork",
        {"name": args.name, "new": args.new, "at": args.at, "with_triggers": args.with_triggers},
    )
    return _done(d, out, f"forked {args.name} at seq {d['fork_seq']} as {d['name']}: {d['state']}")


def cmd_merge(conn: Connection, args: Namespace, out: Out) -> int:
    d = conn.call("merge", {"child": args.child, "into": args.into, "summary": args.summary})
    return _done(d, out, f"merged {args.child} into {d['parent']['name']}")


def cmd_send(conn: Connection, args: Namespace, out: Out) -> int:
    d = conn.call("send", {"to": args.name, "text": args.text, "sender": args.sender})
    if d.get("seq") is None and d.get("node"):  # a cluster: its owner delivers it
        return _done(d, out, f"sent to {args.name} on node {d['node']}")
    return _done(
        d, out, f"sent to {args.name} (seq {d['seq']})" + (", woke it" if d["woke"] else "")
    )


def cmd_compact(conn: Connection, args: Namespace, out: Out) -> int:
    d = conn.call("compact", {"name": args.name, "keep": args.keep})
    return _done(d, out, f"compacted {args.name} ({d['compactions']} compaction(s) so far)")


def _answer(answer: answers.Answer) -> Command:
    def run(conn: Connection, args: Namespace, out: Out) -> int:
        result, text = answer(conn, args)
        return _done(result, out, text)

    return run


def cmd_migrate(conn: Connection, args: Namespace, out: Out) -> int:
    from sessiond.ctl import migrate

    return _answer(migrate.migrate)(conn, args, out)


def cmd_drain(conn: Connection, args: Namespace, out: Out) -> int:
    from sessiond.ctl import cluster

    return _answer(cluster.drain)(conn, args, out)


def cmd_web(conn: Connection, args: Namespace, out: Out) -> int:
    from sessiond.ctl import access

    return _answer(access.web_login)(conn, args, out)


def cmd_export(conn: Connection, args: Namespace, out: Out) -> int:
    from sessiond.ctl.bundles import export_bundle, summary_to_stderr

    d, text = export_bundle(conn, args.name, args.output)
    return summary_to_stderr(d, text, out.json) if args.output == "-" else _done(d, out, text)


def cmd_import(conn: Connection, args: Namespace, out: Out) -> int:
    from sessiond.ctl.bundles import import_bundle

    d = import_bundle(conn, args.bundle, args.name)
    return _done(d, out, f"imported {d['name']}: {d['state']}")


def cmd_reload(conn: Connection, args: Namespace, out: Out) -> int:
    r = conn.call("reload", {})
    if out.json:
        out.emit_json(r)
        return 0
    created, updated = len(r["created"]), len(r["updated"])
    print(f"reloaded: {created} created, {updated} updated, {r['unchanged']} unchanged")
    for error in r["errors"]:
        print(f"refused (the old spec stays in force): {error}")
    for note in r.get("notes", []):
        print(f"note: {note}")
    return 1 if r["errors"] else 0


def cmd_nodes(conn: Connection, args: Namespace, out: Out) -> int:
    rows = conn.call("nodes", {})
    if out.json:
        out.emit_json(rows)
        return 0
    from sessiond.ctl import cluster
    from sessiond.ctl.render import table

    table(cluster.nodes_table(rows), out, colour_col=None)
    return 0


def cmd_ping(conn: Connection, args: Namespace, out: Out) -> int:
    r = conn.call("ping", {})
    up = f"up {r['uptime_s']:.0f}s, {r['sessions']} sessions"
    return _done(r, out, f"sessiond {r['version']} (pid {r['pid']}) {up}")


# The commands each module adds (its add_parsers): `sessionctl X` imports X's module
# alone (tests/e2e/test_lean_client.py checks this against what the modules add).
MODULE_COMMANDS = {
    "models": ("models",),
    "ps": ("ps", "top"),
    "logcmd": ("log",),
    "aliases": ("start", "stop", "restart"),
    "answers": ("approve", "deny", "resolve", "apply"),
    "ops": ("notify", "cat", "trace"),
    "runout": ("output", "status"),
    "gc": ("gc",),
    "offline": ("check", "schema"),
}


def _socket_path(text: str) -> Path:
    from pathlib import Path  # only when --socket is given

    return Path(text)


# the syscalls on one session that answer its state: what they did, and their help
SIMPLE = {
    "suspend": ("suspended", "stop running on wakes"),
    "resume": ("resumed", "run on wakes again"),
    "interrupt": ("interrupted", "stop the running program; the session sleeps"),
    "cancel": ("cancelled", "terminate the session (and its program)"),
}


def parser(only: str | None = None) -> Parser:  # noqa: PLR0915 - one statement per option
    """Every command's parser; with ``only``, the parser of that one command alone
    (OneCommand: what it cannot take, it hands back to this one with every command)."""
    import argparse

    from sessiond.ctl.parsing import OneCommand, Parser

    p = (Parser if only is None else OneCommand)(
        prog="sessionctl", description="Control the sessiond daemon."
    )
    p.add_argument("--version", action="version", version=f"sessionctl {__version__}")
    p.add_argument(
        "--socket",
        type=_socket_path,
        help="the daemon's socket (else SESSIOND_SOCKET, then the default)",
    )
    p.add_argument("--json", action="store_true", help="stable machine-readable output (JSON)")
    # (its prog given: argparse would format the top's usage to find the same)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, prog="sessionctl")
    # --json and --socket also work after the command: `sessionctl ps --json`.
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="stable machine-readable output (JSON)")  # fmt: skip
    common.add_argument("--socket", type=_socket_path, default=argparse.SUPPRESS,
                        help="the daemon's socket (else SESSIOND_SOCKET)")  # fmt: skip
    # where a module's commands not built this time take their options (and nowhere after)
    unused = Parser(add_help=False, conflict_handler="resolve")

    def want(name: str) -> bool:
        return only is None or name == only

    def add(
        name: str, fn: Callable[..., int], help_text: str, *names: str
    ) -> argparse.ArgumentParser:
        if not want(name):
            return unused
        sp = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        for n in names:
            sp.add_argument(n)
        sp.set_defaults(fn=fn)
        return sp

    def wanted(module: str) -> bool:
        return only is None or only in MODULE_COMMANDS[module]

    add("ping", cmd_ping, "is the daemon there, which version")
    add("nodes", cmd_nodes, "a cluster's nodes: incarnation, state, lease age, sessions")
    if wanted("models"):
        from sessiond.ctl import models

        models.add_parser(add)
    if wanted("ps"):
        from sessiond.ctl import ps

        ps.add_parsers(add)
    add("show", cmd_show, "one session in detail", "name")
    if wanted("logcmd"):
        from sessiond.ctl import logcmd

        logcmd.add_parser(add)
    if want("replay"):
        rp = add("replay", cmd_replay, "rebuild from events and show a view; runs nothing", "name")
        rp.add_argument("--upto", type=int, metavar="SEQ")
        rp.add_argument("--view", choices=["state", "messages", "trace", "audit"], default="state")
    add("gate", cmd_gate, "evaluate the resume checks now, as a dry run (exit 1 if not ok)", "name")
    add("create", cmd_create, "register a session from a spec file (TOML)", "spec")
    if want("activate"):
        from sessiond.ctl import aliases

        act = add("activate", aliases.cmd_activate, "wake a session now", "name")
        aliases.add_wait(act)
    for name, (verb, help_text) in SIMPLE.items():
        add(name, _simple(name, verb), help_text, "name")
    if wanted("aliases"):
        from sessiond.ctl import aliases

        aliases.add_parsers(add)
    if want("fork"):
        fk = add("fork", cmd_fork, "a new session starting with this one's events", "name")
        fk.add_argument("--as", dest="new", required=True, metavar="NEW")
        fk.add_argument("--at", type=int, metavar="SEQ", help="default: the latest event")
        fk.add_argument("--with-triggers", action="store_true")
    if want("merge"):
        mg = add(
            "merge",
            cmd_merge,
            "append a child's result to its parent; the child terminates",
            "child",
        )
        mg.add_argument("--into", metavar="PARENT", help="default: the session it was forked from")
        mg.add_argument("--summary", metavar="TEXT")
    if want("send"):
        sd = add("send", cmd_send, "put a message in a session's mailbox", "name", "text")
        sd.add_argument("--from", dest="sender", default="sessionctl", metavar="SENDER")
    if want("migrate"):
        mi = add(
            "migrate",
            cmd_migrate,
            "switch runner profile, or hand the session to another daemon",
            "name",
        )
        mi.add_argument("--profile", metavar="P")
        mi.add_argument("--to", metavar="SOCKET")
        mi.add_argument("--node", metavar="N", help="a cluster: hand it to node N (when it sleeps)")
        mi.add_argument(
            "--force",
            action="store_true",
            help="with --node: its node is down and its workspace is on N now; N takes it over",
        )
    add("drain", cmd_drain, "a cluster: move every session off node N", "name")
    if want("compact"):
        cp = add(
            "compact",
            cmd_compact,
            "replace older context by a summary (the log keeps it all)",
            "name",
        )
        cp.add_argument(
            "--keep", type=int, default=4, metavar="N", help="newest messages kept (default 4)"
        )
    if want("export"):
        ex = add("export", cmd_export, "save a session as a self-checking bundle", "name")
        ex.add_argument(
            "-o", "--output", required=True, metavar="FILE", help="where to write it (- for stdout)"
        )
    if want("import"):
        im = add(
            "import", cmd_import, "load a session from a bundle (it arrives not running)", "bundle"
        )
        im.add_argument("--as", dest="name", metavar="NAME")
    if wanted("answers"):
        from sessiond.ctl import answers

        answers.add_parsers(lambda name, answer, *rest: add(name, _answer(answer), *rest))
    add("reload", cmd_reload, "re-read configuration and specs without dropping sessions")
    if wanted("ops"):
        from sessiond.ctl import ops

        ops.add_parsers(add)
    if wanted("runout"):
        from sessiond.ctl import runout

        runout.add_parsers(add, show=cmd_show)  # output, status
    add("mcp", cmd_mcp, "serve the agent's syscalls over MCP on stdio (for agents)")
    if wanted("gc"):
        from sessiond.ctl import gc

        gc.add_parser(add)
    add("web", cmd_web, "a login for the web console: prints a URL with a fresh token")
    if wanted("offline"):
        from sessiond.ctl import offline

        offline.add_parsers(sub, common)
    if want("completion"):
        co = sub.add_parser(
            "completion",
            help="print a shell completion script",
            description='bash: eval "$(sessionctl completion bash)"; zsh: sessionctl '
            "completion zsh > ~/.zfunc/_sessionctl",
        )
        co.add_argument("shell", choices=["bash", "zsh"])
        co.set_defaults(fn=None)
    return p


def cmd_mcp(conn: Connection, args: Namespace, out: Out) -> int:
    from sessiond.ctl import access

    return access.serve_mcp(args)


# Command lines read without argparse: one of these commands, then exactly its
# positionals, and no option (what scripts, hooks and people type most). argparse's
# import and the build of even one command's parser cost such a process a third
# of its own time. What each would hold that is not on the line: its defaults.
# (tests/e2e/test_lean_client.py checks each against argparse's reading.)
PLAIN: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "ping": ((), {}),
    "show": (("name",), {}),
    "send": (("name", "text"), {"sender": "sessionctl"}),
    "ps": (
        (),
        {
            "state": [],
            "agent": [],
            "label": [],
            "all": False,
            "sort": "agent",
            "full": False,
            "watch": None,
        },
    ),
    **{name: (("name",), {}) for name in SIMPLE},
}


def plain(words: Sequence[str]) -> Namespace | None:
    """``words`` read as argparse would, if they are a PLAIN command line; else None."""
    if not words or words[0] not in PLAIN or any(w.startswith("-") for w in words):
        return None
    positionals, defaults = PLAIN[words[0]]
    if len(words) != 1 + len(positionals):
        return None
    command = words[0]
    fn: Callable[..., int]
    if command == "ps":
        from sessiond.ctl import ps

        fn = ps.cmd_ps
    elif command in SIMPLE:
        fn = _simple(command, SIMPLE[command][0])
    else:
        fn = {"ping": cmd_ping, "show": cmd_show, "send": cmd_send}[command]
    given = dict(zip(positionals, words[1:], strict=True))
    fresh = {k: list(v) if isinstance(v, list) else v for k, v in defaults.items()}
    return Namespace(socket=None, json=False, command=command, **given, **fresh, fn=fn)


def command_line(argv: Sequence[str] | None) -> tuple[Parser | None, Namespace]:
    """The parser that parsed the command line, and what it found: none for a plain
    one (PLAIN); that of its command alone when it names one and parses; else every
    command's (its help, its errors, as always)."""
    words = list(sys.argv[1:] if argv is None else argv)
    fast = plain(words)
    if fast is not None:
        return None, fast
    from sessiond.ctl.parsing import Retry, command_word

    try:  # no command (--version): no command's parser
        top = parser(command_word(words, ("--socket",)) or "")
        return top, top.parse_command_line(words)
    except Retry:
        pass
    top = parser()
    return top, top.parse_command_line(words)


def main(argv: Sequence[str] | None = None) -> int:
    top, args = command_line(argv)
    out = Out(args.json or getattr(args, "output", None) in ("json", "json-lines"))
    path = args.socket or socket_path()
    try:
        if args.command == "completion":
            from sessiond.ctl import offline

            print(offline.completion(parser(), args.shell), end="")
            return 0
        if getattr(args, "offline", None) is not None:  # check, schema: no daemon
            done: int = args.offline(args, out)
            return done
        if args.command == "mcp":  # a server: it connects per tool call, not here
            from sessiond.ctl import access

            return access.serve_mcp(args)
        if args.command == "log":  # a usage error needs no daemon
            from sessiond.ctl import logcmd

            logcmd.params(args)
        if args.command in ("ps", "top"):
            from sessiond.ctl import ps

            ps.params(args)
        timeout = None if args.command == "log" else 120
        # inside a run: its token, which the program endpoint asks of every request;
        # the standard library's json for the frames, but for a log's many events
        # and for --json, which prints with orjson anyway
        plain = not out.json and args.command != "log"
        with Connection(path, timeout, token=os.environ.get("SESSIOND_TOKEN"), plain=plain) as conn:
            if not out.json:  # what a program wrote cannot steer the terminal
                from sessiond.ctl.safeterm import terminal_safe

                conn.clean = terminal_safe
            try:
                code: int = args.fn(conn, args, out)
            except RemoteError as exc:
                if exc.exit_code == 4:  # no such session: the names it may have meant
                    exc.message += _close_names(conn, exc.message)
                raise
            return code
    except RemoteError as exc:
        if exc.code == "usage":  # the usage of the command it is about
            top = top or parser(args.command)
            top.commands().get(args.command, top).print_usage(sys.stderr)
        if out.json:
            import orjson

            sys.stdout.buffer.write(
                orjson.dumps(
                    {"error": {"code": exc.code, "message": exc.message, "exit": exc.exit_code}},
                    option=orjson.OPT_APPEND_NEWLINE,
                )
            )
        from sessiond.ctl.safeterm import safe_text

        # stderr is a person's, --json or not (the exact text is in the JSON above)
        print(f"sessionctl: {safe_text(exc.message)}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0


def _close_names(conn: Connection, message: str) -> str:
    """ "; did you mean 'x'?" from the sessions the caller may list, or ""."""
    import re

    from sessiond.listing import suggest

    found = re.search(r"no session '([^']+)'", message)
    if not found:
        return ""
    try:
        rows = conn.call("ps", {"all": True, "sort": "name"})
    except (RemoteError, OSError):
        return ""  # a program not granted ps, say: no names to offer
    return suggest(found.group(1), [r["name"] for r in rows])


if __name__ == "__main__":
    sys.exit(main())
