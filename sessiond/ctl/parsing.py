"""sessionctl's argument parser: the usage of the command that went wrong, and a
did-you-mean, as git and systemctl give.

argparse prints the top-level usage for an option the command does not know
(``ps --bogus``) and lists every command for a typo; here an error names what
was wrong, the closest choices, and prints the usage of the command it is about.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is mypy's: sessionctl does not import it
    from typing import Any, NoReturn

# patterns, compiled (and cached by re) the first time a command line needs them
_BACK = r"-\d+(\.\d+)?(ms|s|m|h|d)(\d+(\.\d+)?(ms|s|m|h|d))*"
_TIMES = ("--since", "--until")
_CHOICE = r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$"


_COLUMNS: list[int] = []  # once per process: argparse makes a formatter per option


def _columns() -> int:
    """shutil.get_terminal_size().columns, without importing shutil (and with it
    bz2, lzma, fnmatch): argparse makes a formatter for every option it adds."""
    if _COLUMNS:
        return _COLUMNS[0]
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    try:
        lines = int(os.environ["LINES"])
    except (KeyError, ValueError):
        lines = 0
    if columns <= 0 or lines <= 0:
        try:
            size = os.get_terminal_size(sys.__stdout__.fileno())  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            size = os.terminal_size((80, 24))
        if columns <= 0:
            columns = size.columns or 80
    _COLUMNS.append(columns)
    return columns


class Formatter(argparse.HelpFormatter):
    """argparse's, as wide as it would make it (see _columns)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)


class Parser(argparse.ArgumentParser):
    """Subparsers are made of this class too (argparse passes its own class on)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        from sessiond.listing import suggest  # an error's did-you-mean only

        found = re.match(_CHOICE, message)
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
            from sessiond.listing import suggest

            first = extra[0]
            hint = suggest(first, command._option_string_actions) if first.startswith("-") else ""
            command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        return args


class Retry(Exception):
    """A command line the parser of one command does not take: parse it again with
    every command's parser, whose error (or help) is the one to give."""


class OneCommand(Parser):
    """The parser of a command line whose command is known before it is parsed: it
    holds that command's parser alone (building all of them took longer than the
    rest of a ``sessionctl ping``). Anything it cannot take, it hands back (Retry),
    so every error reads as the whole parser's; its subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise Retry(message)

    def format_help(self) -> str:
        if any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            # the top's help lists every command
            raise Retry("help")
        return super().format_help()


def command_word(argv: Sequence[str], valued: Sequence[str]) -> str | None:
    """The command a command line names, read before parsing: the first word that
    is not an option or the value of one of the ``valued`` options (``--socket``,
    or an abbreviation of it, as argparse takes), or None (``--help``, none)."""
    words = iter(argv)
    for word in words:
        if word == "--":
            return next(words, None)
        if not word.startswith("-") or word == "-":
            return word
        if "=" not in word and len(word) > 2 and any(v.startswith(word) for v in valued):
            next(words, None)  # its value
    return None


def _joined(argv: Sequence[str]) -> list[str]:
    """``--since -1h`` as ``--since=-1h``: argparse takes ``-1h`` for an option, and
    journalctl's users type it so."""
    out: list[str] = []
    for word in argv:
        if out and out[-1] in _TIMES and re.fullmatch(_BACK, word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out
