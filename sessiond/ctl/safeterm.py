"""What sessionctl prints for a person is made safe for their terminal.

A session's program chooses much of what sessionctl shows: tool names, step
names, messages, errors, artifact text. A control character in any of them is
an instruction to the terminal: ESC sequences can clear the screen, move the
cursor to overwrite an earlier line (an approval prompt that reads "safe"), set
the window title or, on some terminals, write to the clipboard; a carriage
return hides what came before it on the line; the Unicode bidi overrides make
text display in another order than it reads ("Trojan Source"). So every string
of a daemon's answer is cleaned before the human output formats it: each such
character is shown as its escape (``\\x1b``, ``\\u202e``), visible and harmless.
Newlines and tabs stay (messages have lines). sessionctl's own colours are added
after, by ``Out.paint``, so they still work.

``--json`` output is not cleaned: orjson escapes every control character in a
JSON string, and a program reading it gets the exact text the log holds. The
error line on stderr is a person's even then: it is cleaned with or without it.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is mypy's: sessionctl does not import it
    from typing import Any

# C0 controls but tab and newline, DEL and the C1 controls; the bidi embeddings,
# overrides and isolates, and the marks that steer them (LRM, RLM, ALM).
_UNSAFE = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(text: str) -> str:
    """``text`` with every character a terminal would obey shown as its escape."""
    if text.isascii() and text.isprintable():  # most are: no pattern to compile or run
        return text
    return re.sub(_UNSAFE, _escape, text)


def terminal_safe(value: Any) -> Any:
    """``value`` (a decoded answer) with every string in it made safe: keys too."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {terminal_safe(k): terminal_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [terminal_safe(v) for v in value]
    return value
