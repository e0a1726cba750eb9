"""Session names: ``[a-z0-9][a-z0-9._-]{0,63}``.

A name is also a folder name in the state dir, so the rule doubles as the
guard against path traversal: no slash, no leading dot, no ``..`` alone.
"""

from __future__ import annotations

import re

from sessiond.errors import BadName

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def check_name(name: object, *, what: str = "session name") -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise BadName(
            f"{what} {name!r} is not allowed: use 1 to 64 characters from a-z, 0-9, '.', '_' "
            "and '-', starting with a letter or digit"
        )
    return name
