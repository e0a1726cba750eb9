"""sessionctl's argument parser: the usage of the command that went wrong, and a
did-you-mean, as git and systemctl give.

argparse prints the top-level usage for an option the command does not know
(``ps --bogus``) and lists every command for a typo; here an error names what
was wrong, the closest choices, and prints the usage of the command it is about.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from sessiond.listing import suggest

_BACK = re.compile(r"-\d+(\.\d+)?(ms|s|m|h|d)(\d+(\.\d+)?(ms|s|m|h|d))*")
_TIMES = ("--since", "--until")
_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    """Subparsers are made of this class too (argparse passes its own class on)."""

    def error(self, message: str) -> NoReturn:
        found = _CHOICE.match(message)
        if found:
            what, word, listed = found.groups()
            choices = re.findall(r"'([^']*)'", listed)
            if what in ("COMMAND", "command"):
                message = (
                    f"unknown command {word!r}{suggest(word, choices)} "
                    f"('{self.prog} --help' lists the commands)"
                )
            else:
                message = f"argument {what}: {word!r} is not one of {', '.join(choices)}" + suggest(
                    word, choices
                )
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def commands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def parse_command_line(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """Parse; an argument the command does not take is its error, with its usage."""
        args, extra = self.parse_known_args(_joined(sys.argv[1:] if argv is None else argv))
        if extra:
            command = self.commands().get(getattr(args, "command", "") or "", self)
            assert isinstance(command, argparse.ArgumentParser)
            first = extra[0]
            hint = suggest(first, command._option_string_actions) if first.startswith("-") else ""
            command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        return args


def _joined(argv: Sequence[str]) -> list[str]:
    """``--since -1h`` as ``--since=-1h``: argparse takes ``-1h`` for an option, and
    journalctl's users type it so."""
    out: list[str] = []
    for word in argv:
        if out and out[-1] in _TIMES and _BACK.fullmatch(word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out
