"""The glob dialect of ``watch`` and ``git`` triggers' ``paths`` and ``exclude``.

Separate because it is pure (no loop, no files): a pattern becomes a regular
expression once and is cached, and the routing of every change asks it.
"""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    """A glob as a regular expression: ``*`` and ``?`` stay inside one folder, ``**``
    crosses folders (``src/**`` is everything under src)."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def match(rel: str, patterns: list[str]) -> bool:
    """Glob match on a workspace-relative path; a pattern naming a folder covers it."""
    for pattern in patterns:
        if _glob(pattern).match(rel) or rel.startswith(pattern.rstrip("/") + "/"):
            return True
    return False
