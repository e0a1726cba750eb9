"""Hypothesis strategies for every event payload, derived from the models' fields."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from hypothesis import strategies as st
from pydantic import AfterValidator, BaseModel, JsonValue

from sessiond.log.event_data import (
    PAYLOADS,
    EventData,
    _check_handover,
    _check_hash,
    _check_ref,
)

TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30)
HEX64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | TEXT
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def for_type(tp: Any, meta: tuple[Any, ...] = ()) -> st.SearchStrategy[Any]:
    if get_origin(tp) is Annotated:
        inner, *more = get_args(tp)
        return for_type(inner, (*more, *meta))
    for m in meta:
        if isinstance(m, AfterValidator) and m.func is _check_ref:
            return HEX64.map(lambda h: "sha256:" + h)
        if isinstance(m, AfterValidator) and m.func is _check_hash:
            return st.none() | HEX64
        if isinstance(m, AfterValidator) and m.func is _check_handover:
            return HEX64.map(lambda h: h[:32])
    if tp is JsonValue:
        return JSON
    if tp is str:
        patterns = [m.pattern for m in meta if isinstance(getattr(m, "pattern", None), str)]
        if patterns:  # a Field(pattern=...): generated to match it, not filtered to it
            return st.from_regex(patterns[0], fullmatch=True)
        return TEXT
    if tp is bool:
        return st.booleans()
    if tp is int:
        lo, hi = -(2**53), 2**53
        for m in meta:
            if isinstance(m, annotated_types.Ge):
                lo = int(m.ge)  # type: ignore[call-overload]
            if isinstance(m, annotated_types.Le):
                hi = int(m.le)  # type: ignore[call-overload]
        return st.integers(lo, hi)
    if tp is float:  # finite (no field allows NaN or infinity), and at least its ge
        ges = [m.ge for m in meta if isinstance(m, annotated_types.Ge)]
        low = float(ges[0]) if ges else -1e9  # type: ignore[arg-type]
        return st.floats(low, 1e9, allow_nan=False, allow_infinity=False)
    if tp is type(None):
        return st.none()
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return st.one_of([for_type(a, meta) for a in get_args(tp)])
    if origin is Literal:
        return st.sampled_from(get_args(tp))
    if origin is dict:
        key, value = get_args(tp)
        return st.dictionaries(for_type(key), for_type(value), max_size=3)
    if origin is tuple:
        return st.lists(for_type(get_args(tp)[0]), max_size=3).map(tuple)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return model(tp)
    raise TypeError(f"no strategy for {tp!r}: teach tests/strategies.py this field type")


def model(cls: type[BaseModel]) -> st.SearchStrategy[Any]:
    fields = {
        name: for_type(f.annotation, tuple(f.metadata)) for name, f in cls.model_fields.items()
    }
    strategy = st.fixed_dictionaries(fields).map(lambda kw: _build(cls, kw))
    return strategy.filter(lambda m: m is not None)


def _build(cls: type[BaseModel], kw: dict[str, Any]) -> BaseModel | None:
    try:
        return cls(**kw)
    except ValueError:  # a cross-field rule (e.g. from_seq <= to_seq) said no
        return None


PAYLOAD_STRATEGIES: dict[type[EventData], st.SearchStrategy[Any]] = {p: model(p) for p in PAYLOADS}
ANY_PAYLOAD: st.SearchStrategy[EventData] = st.one_of(list(PAYLOAD_STRATEGIES.values()))
