"""Durations as people write them in specs and configuration: ``"200ms"``, ``"1h30m"``."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """Seconds in ``value``: a number of seconds, or text like ``"1h30m"``, ``"200ms"``."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or text like '10m', '200ms', '1h30m'")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("a duration is a number of seconds or text like '10m', '200ms', '1h30m'")
    text = value.strip().replace(" ", "")
    pos = 0
    total = 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        raise ValueError(
            f"{value!r} is not a duration: write a number and a unit (ms, s, m, h, d), "
            "e.g. '200ms', '10m', '1h30m'"
        )
    return total


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    parts = []
    rest = round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


# A pydantic field type: accepts "10m" or 600 and holds seconds as a float.
Duration = Annotated[float, BeforeValidator(parse_duration)]
