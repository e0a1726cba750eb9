"""Durations as people write them in specs and configuration: ``"200ms"``, ``"1h30m"``."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The longest duration anything takes: a hundred years. Longer ones (and NaN or
# infinity, which TOML writes as nan and inf) would overflow the daemon's clock
# arithmetic (a datetime plus the duration) long after the spec was accepted.
MAX_DURATION = 36500 * 86400.0
_TOO_LONG = "a duration is at most 100 years ('36500d')"


def parse_duration(value: object) -> float:
    """Seconds in ``value``: a number of seconds, or text like ``"1h30m"``, ``"200ms"``."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or text like '10m', '200ms', '1h30m'")
    if isinstance(value, int | float):
        # (an int is finite, and one too large for a float overflows isfinite)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(
                f"{value!r} is not a duration: write a finite number of seconds or text "
                "like '10m', '200ms', '1h30m'"
            )
        if value < 0:
            raise ValueError("a duration cannot be negative")
        if value > MAX_DURATION:
            raise ValueError(_TOO_LONG)
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
    if total > MAX_DURATION:  # also a number of digits so long that it is infinite
        raise ValueError(_TOO_LONG)
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
