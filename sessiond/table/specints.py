"""Integers a spec may hold: what its events can record."""

from __future__ import annotations


def huge_at(value: object, where: str) -> str | None:
    """Where in the parsed spec an integer beyond 64 bits is (TOML's own bound: the
    spec's values are recorded in its events, whose encoding holds no larger)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return where if not -(2**63) <= value < 2**64 else None
    items: list[tuple[str, object]] = []
    if isinstance(value, dict):
        items = [(f"{where}.{key}".lstrip("."), inner) for key, inner in value.items()]
    elif isinstance(value, list):
        items = [(f"{where}[{i}]", inner) for i, inner in enumerate(value)]
    for inner_where, inner in items:
        if (found := huge_at(inner, inner_where)) is not None:
            return found
    return None
