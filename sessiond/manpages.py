"""Man pages for ``sessiond`` and ``sessionctl``, generated from their parsers.

``make man`` (``python -m sessiond.manpages man``) writes ``man/sessiond.8``
and ``man/sessionctl.1``; the files are committed, and
``tests/test_cli_completion_and_man_pages.py`` fails when they differ from what the parsers say
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


# What an argument without a help text of its own means (the page never says "-").
FALLBACK = {
    "name": "the session's name (sessionctl ps lists them)",
    "spec": "a session spec file (TOML; docs/spec.md)",
    "text": "the message",
    "child": "the forked session to merge",
    "bundle": "a bundle file written by sessionctl export",
    "call": "the tool call's id, as show and log print it",
    "with_triggers": "the fork gets the parent's triggers too (else it has none)",
    "upto": "rebuild only up to this seq",
    "to": "another daemon's socket: hand the session over to it",
    "summary": "the text appended to the parent (default: the child's result)",
    "reason": "why, recorded in the log and shown to the session",
    "profile": "the runner profile to switch to",
    "sender": "who the message is from (default: sessionctl)",
    "new": "the new session's name",
    "state_dir": "where the sessions live (else SESSIOND_STATE_DIR, then the default)",
    "fsck_dir": "the state dir to check",
}


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
        text = action.help or FALLBACK.get(action.dest, "")
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


FILES = [
    ("$XDG_RUNTIME_DIR/sessiond/sessiond.sock", "the control socket (root: /run/sessiond/)"),
    (
        "$XDG_STATE_HOME/sessiond/",
        "the state dir: one folder per session under sessions/, "
        "with its append-only events.jsonl, snapshots and artifacts (root: /var/lib/sessiond/)",
    ),
    ("config/sessiond.toml", "the daemon's configuration; every key is documented there"),
    ("docs/spec.md", "the session spec (TOML) that sessionctl create reads"),
]
SIGNALS = [
    (
        "SIGTERM, SIGINT",
        "stop accepting requests, stop every run (grace shutdown_grace), "
        "record each run's end, snapshot, exit 0",
    ),
    ("SIGHUP", "re-read the configuration and the specs, as sessionctl reload"),
]
CTL_SIGNALS = [
    (
        "SIGINT",
        "(Ctrl-C) ends log \\-f, ps \\-\\-watch and top with exit 0; a request "
        "already sent is carried out by the daemon",
    ),
    ("SIGPIPE", "output closed early (| head): sessionctl exits 0 quietly"),
]
DAEMON_EXITS = [
    ("0", "stopped by SIGTERM or SIGINT, or a check that passed"),
    (
        "1",
        "cannot start: another daemon holds the state dir, the state dir is not writable, "
        "or a check failed",
    ),
    ("2", "usage error or bad configuration"),
]
CTL_EXAMPLES = [
    ("sessionctl create docs.toml && sessionctl start docs", "register a session, run it now"),
    (
        "sessionctl ps \\-\\-state blocked,suspended \\-\\-agent docs",
        "the sessions of agent docs that wait for a person",
    ),
    ("sessionctl ps \\-\\-all \\-\\-sort last\\-active", "every session, the latest first"),
    ("sessionctl log docs \\-\\-since today \\-o cat", "what docs did today, as text"),
    (
        "sessionctl log \\-\\-all \\-\\-since \\-1h \\-o json\\-lines",
        "every session's last hour, an object per line",
    ),
    ("sessionctl log docs \\-f", "follow docs' events as they come"),
    ("sessionctl approve docs \\-\\-call r3.2", "let a waiting tool call run"),
]
DAEMON_EXAMPLES = [
    ("sessiond", "serve the sessions of this user (socket and state dir by default)"),
    ("sessiond \\-\\-config /etc/sessiond/sessiond.toml", "a system daemon (see systemd/)"),
]
DAEMON_COMMANDS = (
    "sessiond takes no commands: sessionctl(1) drives it over its socket (ps, show, log, "
    "create, start, stop, restart, activate, suspend, resume, interrupt, cancel, approve, "
    "deny, resolve, fork, merge, send, reload, ...)."
)
CTL_DESCRIPTION = (
    "sessionctl talks to sessiond over its Unix socket. sessiond schedules AI\\-agent "
    "sessions as an operating system schedules processes: each session has a state "
    "(created, ready, running, sleeping, suspended, blocked, terminated), an append\\-only "
    "log of events, triggers that wake it, and a gate that checks, before each run, that "
    "it may continue. Output is for people on a terminal and whole when piped; "
    "\\-\\-json gives stable machine\\-readable output. "
    "start, stop and restart are systemctl's verbs: start resumes a suspended session "
    "and activates it; stop suspends it (its program is stopped and no wake runs it "
    "until start); restart interrupts the current run and activates it again."
)


def _items(title: str, items: list[tuple[str, str]], raw: bool = False) -> list[str]:
    out = [f".SH {title}"]
    for key, value in items:
        out += [".TP", f"\\fB{key if raw else _esc(key)}\\fR", value if raw else _esc(value)]
    return out


def _has_commands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def pages() -> dict[str, str]:
    exits = [".SH EXIT STATUS"] + [x for code, what in EXIT_CODES for x in (".TP", code, what)]
    env = [".SH ENVIRONMENT"] + [x for k, v in ENVIRONMENT for x in (".TP", k, _esc(v))]
    see = [".SH SEE ALSO", "\\fBsessiond\\fR(8), \\fBsessionctl\\fR(1); README.md and docs/"]
    files = _items("FILES", FILES)
    ctl = ctl_parser()
    ctl.description = CTL_DESCRIPTION
    daemon = daemon_parser()
    daemon_exits = [".SH EXIT STATUS"] + [
        x for code, what in DAEMON_EXITS for x in (".TP", code, _esc(what))
    ]
    return {
        "sessionctl.1": page(
            ctl,
            "1",
            "control the sessiond daemon",
            files + env + _items("SIGNALS", CTL_SIGNALS, raw=True) + exits
            + _items("EXAMPLES", CTL_EXAMPLES, raw=True) + see,
        ),
        "sessiond.8": page(
            daemon,
            "8",
            "schedule AI-agent sessions like processes",
            [*([] if _has_commands(daemon) else [".SH COMMANDS"]), _esc(DAEMON_COMMANDS),
             *files, *env,
             *_items("SIGNALS", SIGNALS), *daemon_exits,
             *_items("EXAMPLES", DAEMON_EXAMPLES, raw=True), *see],
        ),
    }  # fmt: skip


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "man")
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (folder / name).write_text(text)
        print(f"wrote {folder / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
