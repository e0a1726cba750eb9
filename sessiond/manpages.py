"""Man pages for ``sessiond`` and ``sessionctl``, generated from their parsers.

``make man`` (``python -m sessiond.manpages man``) writes ``man/sessiond.8``
and ``man/sessionctl.1``; the files are committed, and
``tests/test_cli_polish.py`` fails when they differ from what the parsers say
now, so a new option cannot be left out of them. A tool, beside bench/ and
demo.py: it imports both commands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sessiond import __version__
from sessiond.ctl import parser as ctl_parser
from sessiond.daemon.cli import _parser as daemon_parser

DATE = "2026-12"  # fixed, so the committed pages only change when the parsers do

EXIT_CODES = [
    ("0", "done"),
    ("1", "refused (illegal transition, gate not ok, denied, already exists, a failing target)"),
    ("2", "usage error"),
    ("3", "daemon not reachable"),
    ("4", "no such session"),
    ("5", "invalid input (bad spec, bad bundle, bad value)"),
    ("6", "a cluster's database not reachable (the message names it)"),
    ("70", "internal error"),
]
ENVIRONMENT = [
    ("SESSIOND_SOCKET", "the daemon's control socket (else the default under the runtime dir)"),
    ("SESSIOND_CONFIG", "the daemon's configuration file (sessiond)"),
    ("SESSIOND_STATE_DIR", "where the sessions live (sessiond)"),
    ("NO_COLOR", "no colour in sessionctl's tables"),
]


def _esc(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + ln) if ln.startswith((".", "'")) else ln for ln in text.split("\n"))


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().split()[1:])


def _options(parser: argparse.ArgumentParser, skip: frozenset[str]) -> list[str]:
    out: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.dest in skip:
            continue
        if action.option_strings:
            metavar = ""
            if action.nargs != 0:
                metavar = " " + str(action.metavar or action.dest.upper())
            names = ", ".join(f"\\fB{_esc(o)}\\fR{_esc(metavar)}" for o in action.option_strings)
        else:
            names = f"\\fI{_esc(str(action.metavar or action.dest))}\\fR"
        text = action.help or ""
        if action.choices and not isinstance(action.choices, dict):
            text += (" " if text else "") + "(one of: " + ", ".join(map(str, action.choices)) + ")"
        out += [".TP", names, _esc(text or "-")]
    return out


def page(parser: argparse.ArgumentParser, section: str, summary: str, extra: list[str]) -> str:
    name = parser.prog
    lines = [
        f'.TH {name.upper()} {section} "{DATE}" "sessiond {__version__}" "sessiond manual"',
        ".SH NAME",
        f"{name} \\- {_esc(summary)}",
        ".SH SYNOPSIS",
        f"\\fB{name}\\fR {_esc(_usage(parser).removeprefix(name).strip())}",
        ".SH DESCRIPTION",
        _esc(parser.description or summary),
        ".SH OPTIONS",
        *_options(parser, frozenset()),
    ]
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        lines.append(".SH COMMANDS")
        helps = {c.dest: c.help for c in subs[0]._choices_actions}
        for cmd, sub in subs[0].choices.items():
            usage = _usage(sub).removeprefix(f"{name} {cmd}").strip()
            lines += [".SS " + f"\\fB{cmd}\\fR {_esc(usage)}".rstrip(), _esc(helps.get(cmd) or "")]
            # -h and the options every command shares are said once, above
            opts = _options(sub, frozenset({"help", "json", "socket"}))
            if opts:
                lines += [".RS", *opts, ".RE"]
    lines += extra
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    exits = [".SH EXIT STATUS"] + [x for code, what in EXIT_CODES for x in (".TP", code, what)]
    env = [".SH ENVIRONMENT"] + [x for k, v in ENVIRONMENT for x in (".TP", k, _esc(v))]
    see = [".SH SEE ALSO", "\\fBsessiond\\fR(8), \\fBsessionctl\\fR(1); README.md and docs/"]
    return {
        "sessionctl.1": page(ctl_parser(), "1", "control the sessiond daemon", exits + env + see),
        "sessiond.8": page(
            daemon_parser(),
            "8",
            "schedule AI-agent sessions like processes",
            [*env, ".SH FILES", "config/sessiond.toml documents every configuration key.", *see],
        ),
    }


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "man")
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (folder / name).write_text(text)
        print(f"wrote {folder / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
