"""sessiond.redaction: the redactor and ``matches`` (the refusal helper)."""

from __future__ import annotations

import json
from typing import Any

from sessiond.redaction import MASK, Redactor, matches, redactor

KEY = "sk-" + "A" * 24


def test_text_masks_patterns_and_literals() -> None:
    r = Redactor([r"sk-[A-Za-z0-9]{20,}"], ["hunter2"])
    assert r.text(f"key {KEY} pass hunter2.") == f"key {MASK} pass {MASK}."


def test_unchanged_text_is_the_same_object() -> None:
    r = Redactor([r"sk-[A-Za-z0-9]{20,}"])
    text = "nothing secret here " * 3
    assert r.text(text) is text
    data = b"plain bytes"
    assert r.data(data) is data


def test_longest_literal_wins() -> None:
    r = Redactor([], ["abc", "abcdef"])
    assert r.text("xabcdefx") == f"x{MASK}x"


def test_bytes_keep_undecodable_bytes() -> None:
    r = Redactor(["secret"])
    assert r.data(b"\xff secret \xfe") == b"\xff " + MASK.encode() + b" \xfe"


def test_walk_masks_every_string_value_and_keeps_structure() -> None:
    r = Redactor([r"sk-[A-Za-z0-9]{20,}"])
    value: dict[str, Any] = {"headers": [{"auth": f"Bearer {KEY}"}], "n": 3}
    value.update(ok=True, none=None)
    out = r.walk(value)
    assert out == {"headers": [{"auth": f"Bearer {MASK}"}], "n": 3, "ok": True, "none": None}
    assert value["headers"][0]["auth"].endswith(KEY)  # the input is not changed
    clean = {"a": ["b", {"c": "d"}]}
    assert r.walk(clean) is clean


def test_redactor_is_none_when_nothing_to_mask_and_cached_otherwise() -> None:
    assert redactor([]) is None
    assert redactor(["x"]) is redactor(["x"])
    assert redactor([], frozenset({"v"})) is not None


def test_matches_names_the_path_of_the_first_match() -> None:
    pats = [r"sk-[A-Za-z0-9]{20,}"]
    assert matches(pats, {"choices": [{"text": "ok"}, {"text": KEY}]}) == "$.choices[1].text"
    assert matches(pats, KEY) == "$"
    assert matches(pats, {"a b": [KEY]}) == "$['a b'][0]"
    assert matches(pats, {"h": {KEY: 1}}) == "$.h (one of its keys)"
    assert matches(pats, [b"x", KEY.encode()]) == "$[1]"
    assert matches(pats, {"n": 1, "t": "fine"}) is None
    assert matches([], KEY) is None
    assert matches(None, KEY) is None
    assert matches(Redactor([], ["hunter2"]), {"p": "hunter2"}) == "$.p"


def test_patterns_that_cannot_be_joined_still_mask() -> None:
    # an inline flag not at the start, and a group name used twice, once joined
    r = Redactor([r"(?i)secret", r"(?P<k>ab)c", r"(?P<k>xy)z"], ["lit"])
    assert r.text("SECRET abc xyz lit") == f"{MASK} {MASK} {MASK} {MASK}"
    assert r.text("nothing") == "nothing"


def test_ident_masks_each_match_by_a_keyed_digest() -> None:
    r = Redactor([r"sk-[A-Za-z0-9]{20,}"], ["hunter2"])
    other = "sk-" + "B" * 24
    a, b = r.ident(f"order-{KEY}"), r.ident(f"order-{other}")
    assert KEY not in a
    assert a.startswith("order-redacted.")
    assert a != b  # two secrets stay two names
    assert r.ident(f"order-{KEY}") == a  # the same secret, the same name
    assert r.ident(a) == a  # a mask is never masked again
    assert r.ident("plain") == "plain"
    assert "hunter2" not in r.ident("x-hunter2-y")


def test_walk_masks_keys_as_names() -> None:
    r = Redactor([r"sk-[A-Za-z0-9]{20,}"])
    value = {"a": 1, KEY: {"inner": KEY}, "z": [KEY]}
    out = r.walk(value)
    assert KEY not in str(out)
    assert list(out)[::2] == ["a", "z"]  # order kept
    assert out["z"] == [MASK]
    plain = {"a": {"b": "c"}}
    assert r.walk(plain) is plain


def test_a_secret_value_is_masked_in_its_escaped_forms_too() -> None:
    value = "pa\"ss\\wo'rd\u00e9\n"
    r = Redactor([], [value])
    for form in (value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
        assert r.text(f"x {form} y") == f"x {MASK} y", form
    assert value[:-1] not in r.text(repr(RuntimeError(f"boom {value}")))
    assert r.text(repr(RuntimeError(f"boom {value}"))) == f"RuntimeError('boom {MASK}')"
