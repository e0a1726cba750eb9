"""How sessionctl prints: colours, relative times, tables, cut cells."""

from __future__ import annotations

import os
import sys
import time

# What each command needs it imports when it needs it (orjson for --json, datetime
# for a relative time): `sessionctl ping` imports none of them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STATE_COLOURS = {
    "running": "32",  # green
    "ready": "36",  # cyan
    "sleeping": "34",  # blue
    "suspended": "33",  # yellow
    "blocked": "31;1",  # bold red
    "arriving": "35",  # magenta: held until its hand-over ends
    "terminated": "90",  # grey
    "created": "0",
}


class Out:
    """Where and how to print: colour on a terminal only, JSON when asked."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json
        self.colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")

    def paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour and code != "0" else text

    def emit_json(self, value: Any) -> None:
        import orjson

        sys.stdout.buffer.write(orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE))


def ago(ts: str | None, now: float | None = None) -> str:
    """ "3 min ago", "in 2 h" from an RFC 3339 time."""
    if not ts:
        return "-"
    from datetime import datetime

    try:
        then = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return ts
    delta = (now or time.time()) - then
    future = delta < 0
    delta = abs(delta)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if delta >= size or unit == "s":
            text = f"{int(delta // size)} {unit}"
            return f"in {text}" if future else f"{text} ago"
    return ts


def when(next_wake: str | None) -> str:
    """A next-wake text with its time made relative: "in 2 h; on message"."""
    if not next_wake:
        return "-"
    first, _, rest = next_wake.partition("; ")
    if first[:4].isdigit():
        first = ago(first)
    return f"{first}; {rest}" if rest else first


def table(rows: list[list[str]], out: Out, colour_col: int | None = None) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            text = cell.ljust(widths[i]) if i < len(row) - 1 else cell
            if n == 0:
                text = out.paint(text, "1")
            elif i == colour_col:
                text = out.paint(text, STATE_COLOURS.get(cell.strip(), "0"))
            cells.append(text)
        print("  ".join(cells).rstrip())


def cut(text: str, width: int, full: bool) -> str:
    """``text`` whole when ``full``, else at most ``width`` characters, the cut
    marked with an ellipsis: a cell never ends mid-word without saying so."""
    if full or len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…"
