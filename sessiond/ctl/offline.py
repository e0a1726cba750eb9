"""The sub-commands that need no daemon: ``check`` (a spec, with the errors
``create`` gives), ``schema`` (the spec's JSON Schema, for editors) and
``completion`` (bash and zsh, generated from the parser by shtab).

Each imports what it needs when it runs (the spec models, shtab): ``sessionctl
ps`` and the other everyday commands never load them (docs/design.md section 3).
The spec models are the daemon's own (sessiond.table.spec), so ``check``
refuses exactly what ``create`` refuses, in the same words; that one lazy
import is the clients' only exception to the floors (tests/test_layers.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from sessiond.wire import RemoteError

# sub-commands share one signature (args, out)
# ruff: noqa: ARG001

Offline = Callable[[argparse.Namespace, Any], int]

# Session names for completion: from `sessionctl ps --json`, without jq or python.
SESSIONS_BASH = """
_sessionctl_sessions() {
    local names
    names=$(sessionctl ps --json 2>/dev/null | tr ',' '\\n' \\
        | sed -n 's/.*"name":"\\([^"]*\\)".*/\\1/p')
    compgen -W "$names" -- "$1"
}
"""
SESSIONS_ZSH = """
_sessionctl_sessions() {
    local -a names
    names=(${(f)"$(sessionctl ps --json 2>/dev/null | tr ',' '\\n' \\
        | sed -n 's/.*"name":"\\([^"]*\\)".*/\\1/p')"})
    _describe 'session' names
}
"""
SESSION_NAMES = {"bash": "_sessionctl_sessions", "zsh": "_sessionctl_sessions"}
# positionals that name a session
NAME_DESTS = {"name", "child"}


def cmd_check(args: argparse.Namespace, out: Any) -> int:
    """Validate a spec file as ``create`` would, without a daemon."""
    from sessiond.errors import SessiondError
    from sessiond.syscalls.control import check_environment
    from sessiond.table.spec import parse_spec

    path = Path(args.spec)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RemoteError("invalid_input", f"cannot read {path}: {exc.strerror}", 5) from exc
    except UnicodeDecodeError as exc:
        raise RemoteError("invalid_input", f"{path} is not UTF-8 text", 5) from exc
    try:
        spec = parse_spec(text, base=path.resolve().parent, source=str(path))
        check_environment(spec)
    except SessiondError as exc:
        raise RemoteError(exc.code, str(exc), exc.exit_code) from None
    result = {"ok": True, "name": spec.name, "spec": str(path)}
    if out.json:
        out.emit_json(result)
    else:
        print(f"{path}: ok (session {spec.name!r})")
    return 0


def cmd_schema(args: argparse.Namespace, out: Any) -> int:
    """The spec's JSON Schema (draft 2020-12), for editors and CI."""
    from sessiond.table.spec import SessionSpec

    schema = SessionSpec.model_json_schema()
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "sessiond session spec",
        **schema,
    }
    sys.stdout.buffer.write(orjson.dumps(schema, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def completion(parser: argparse.ArgumentParser, shell: str) -> str:
    """A completion script for ``shell`` from the parser: every command and option,
    and session names where a command takes one."""
    import shtab

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for a in sub._actions:
                    if a.dest in NAME_DESTS and not a.option_strings:
                        a.complete = SESSION_NAMES
                    elif a.dest in ("spec", "bundle", "output"):
                        a.complete = shtab.FILE
    preamble = {"bash": SESSIONS_BASH, "zsh": SESSIONS_ZSH}[shell]
    script: str = shtab.complete(parser, shell=shell, preamble=preamble)
    return script


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    ck = sub.add_parser(
        "check",
        parents=[common],
        help="validate a spec file offline, with the errors create gives (exit 5 if bad)",
        description="validate a spec file offline, with the errors create gives (exit 5 if bad)",
    )
    ck.add_argument("spec")
    ck.set_defaults(offline=cmd_check)
    sc = sub.add_parser(
        "schema",
        parents=[common],
        help="print the spec's JSON Schema (for editors)",
        description="print the spec's JSON Schema (for editors)",
    )
    sc.set_defaults(offline=cmd_schema)
