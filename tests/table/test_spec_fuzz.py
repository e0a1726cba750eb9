"""Hostile session specs: whatever the text, `parse_spec` returns a spec or raises
`BadSpec` with a message that names the source — never another exception, which
the daemon would report as an internal error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiond.table.spec import BadSpec, SessionSpec, parse_spec

KEYS = [
    "name", "run", "exec", "cwd", "kind", "timeout", "side_effect", "idempotency",
    "resume", "writes", "profile", "env", "trigger", "type", "schedule", "timezone",
    "jitter", "every", "paths", "exclude", "debounce", "repo", "ref", "policy", "ask",
    "allow", "deny", "budget", "seconds_per_run", "tokens", "bind", "files", "redact",
    "retry", "../x", "", "名前",
]  # fmt: skip
WORDS = [
    "command", "sdk", "git", "cron", "every", "watch", "dependency", "message", "none",
    "external", "idempotent", "rerun", "block", "*/5 * * * *", "5m", "0s", "-1s",
    "src/**", "../..", "/etc/passwd", "~", "UTC", "Mars/Olympus", "HEAD", "sh",
    "nan", "inf", "1e999s", "/tmp", "/tmp/x/../y", "/tmp/**",
]  # fmt: skip
SCALARS = (
    st.sampled_from(WORDS)
    | st.text(max_size=20)
    | st.integers(-(2**63), 2**63 - 1)
    | st.booleans()
    | st.floats()  # nan and inf too: TOML writes them, and they must be refused, not crash
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=20,
)
SPECS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=8)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return orjson.dumps(value).decode()  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    inline = ", ".join(f"{orjson.dumps(k).decode()} = {toml_value(v)}" for k, v in value.items())
    return "{" + inline + "}"


def toml(data: dict[str, Any]) -> str:
    return "".join(f"{orjson.dumps(k).decode()} = {toml_value(v)}\n" for k, v in data.items())


def outcome(text: str) -> SessionSpec | str:
    """The parsed spec, or the refusal's message."""
    try:
        return parse_spec(text, base=Path("/tmp"), source="fuzz.toml")
    except BadSpec as exc:
        return str(exc)


def parsed_or_refused_with_a_reason(result: SessionSpec | str) -> bool:
    if isinstance(result, SessionSpec):
        return True
    return result.startswith("fuzz.toml: ") and len(result) > len("fuzz.toml: ")


@given(SPECS)
def test_structured_specs_parse_or_are_refused_with_a_reason(data: dict[str, Any]) -> None:
    assert parsed_or_refused_with_a_reason(outcome(toml(data)))


@given(
    st.fixed_dictionaries(
        {"name": st.just("s"), "run": st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6)},
        optional={"trigger": st.lists(st.dictionaries(st.sampled_from(KEYS), VALUES), max_size=3)},
    )
)
def test_specs_with_a_run_parse_or_are_refused_with_a_reason(data: dict[str, Any]) -> None:
    assert parsed_or_refused_with_a_reason(outcome(toml(data)))


@given(st.text(max_size=300))
def test_any_text_parses_or_is_refused_with_a_reason(text: str) -> None:
    assert parsed_or_refused_with_a_reason(outcome(text))


def test_a_nul_anywhere_is_refused_with_where_it_is() -> None:
    text = 'name = "s"\n[run]\nexec = ["sh", "-c", "echo a\\u0000b"]\n'
    with pytest.raises(BadSpec, match=r"^s\.toml: run\.exec\[2\]: contains a NUL character"):
        parse_spec(text, base=Path("/tmp"), source="s.toml")
