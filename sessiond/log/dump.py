"""Event payloads as the plain dicts of a line, without pydantic's serializer.

An append turns its payload into the ``data`` dict of the record (which the fold
keeps and orjson encodes). pydantic's ``to_python(mode="json")`` costs 0.4-1.9 µs
a payload; this module compiles, once per payload class, a function that reads
the validated fields straight from the instance and builds the same dict: the
same keys (aliases included) in the same order, tuples as lists, nested models
as dicts, containers copied (the record never shares a mutable object with the
model). The line it gives is byte-identical (tests/log/test_dump.py checks every
event type against pydantic's output).

A class the compiler does not understand (a serializer of its own, a field type
it does not know), or a value it does not expect (a subclass where a model was
declared, a float that is not finite), falls back to pydantic for that payload:
the fast path is an optimisation, never a second definition of the format.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, JsonValue

Dumper = Callable[[Any], Any]

_SCALARS = (str, int, bool, type(None))


class _Slow(Exception):
    """A value the compiled dumper does not handle: pydantic's serializer does."""


class _Unsupported(Exception):
    """A field type the compiler does not handle: the class keeps pydantic's serializer."""


def _pydantic(data: BaseModel) -> Any:
    return data.__pydantic_serializer__.to_python(data, mode="json", by_alias=True)


def _json(value: Any) -> Any:
    """A deep copy of a JSON value as pydantic's JSON mode gives it back."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        return {k: _json(v) for k, v in value.items()}
    if kind is list:
        return [_json(v) for v in value]
    if kind is float and math.isfinite(value):
        return value
    raise _Slow


def _float(value: Any) -> Any:
    if type(value) is float and not math.isfinite(value):
        raise _Slow
    return value


class _Compiler:
    """Source of one dumper a model class, with the helpers it calls."""

    def __init__(self) -> None:
        # the globals of the compiled source: helpers and classes by the names it uses
        self.names: dict[str, Any] = {"_Slow": _Slow, "_json": _json, "_float": _float}
        self.models: dict[type[BaseModel], str] = {}

    def expr(self, tp: Any, v: str) -> str | None:
        """An expression that converts the value named ``v`` of type ``tp`` (None: as it is)."""
        if get_origin(tp) is Annotated:
            inner, *meta = get_args(tp)
            if any(_serializes(m) for m in meta):
                raise _Unsupported
            return self.expr(inner, v)
        if tp in _SCALARS:
            return None
        if tp is float:
            return f"_float({v})"
        if tp is JsonValue:
            return f"_json({v})"
        origin = get_origin(tp)
        if origin is Literal:
            if all(type(a) in (str, int, bool) for a in get_args(tp)):
                return None
            raise _Unsupported
        if origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            inner = [self.expr(a, v) for a in args]
            if all(e is None for e in inner):
                return None
            if len(args) == 1 and len(args) < len(get_args(tp)):
                return f"(None if {v} is None else {inner[0]})"
            if set(args) <= {int, float}:
                return f"_float({v})"
            raise _Unsupported
        if origin is tuple:
            item, *rest = get_args(tp)
            if rest != [Ellipsis]:
                raise _Unsupported
            each = self.expr(item, "i")
            return f"list({v})" if each is None else f"[{each} for i in {v}]"
        if origin is dict:
            key, value = get_args(tp)
            if self.expr(key, "k") is not None:
                raise _Unsupported
            each = self.expr(value, "i")
            return f"dict({v})" if each is None else f"{{k: {each} for k, i in {v}.items()}}"
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return f"{self.model(tp)}({v})"
        raise _Unsupported

    def model(self, cls: type[BaseModel]) -> str:
        """The helper's name that dumps an instance of exactly ``cls``."""
        if cls in self.models:
            return self.models[cls]
        decorators = cls.__pydantic_decorators__
        config = cls.model_config
        if (
            decorators.field_serializers
            or decorators.model_serializers
            or decorators.computed_fields
            or config.get("extra") != "forbid"
            or cls.__pydantic_root_model__
        ):
            raise _Unsupported
        name = f"_m{len(self.models)}"
        self.models[cls] = name
        self.names[f"{name}_cls"] = cls
        items = []
        for field, info in cls.model_fields.items():
            if any(_serializes(m) for m in info.metadata) or info.exclude:
                raise _Unsupported
            key = info.serialization_alias or info.alias or field
            value = f"d[{field!r}]"
            items.append(f"{key!r}: {self.expr(info.annotation, value) or value}")
        body = ", ".join(items)
        source = (
            f"def {name}(m):\n"
            f"    if type(m) is not {name}_cls:\n"
            f"        raise _Slow\n"
            f"    d = m.__dict__\n"
            f"    return {{{body}}}\n"
        )
        # the source is built above from the class's own field names and types
        exec(source, self.names)
        return name


def _serializes(meta: Any) -> bool:
    """Metadata that changes how a value is written (a PlainSerializer and the like)."""
    return type(meta).__name__ in ("PlainSerializer", "WrapSerializer", "SerializeAsAny")


def compile_dumper(cls: type[BaseModel]) -> Dumper:
    """The compiled dumper of ``cls`` (it raises ``_Slow`` on a value it does not
    expect), or pydantic's serializer when the class cannot be compiled."""
    compiler = _Compiler()
    try:
        name = compiler.model(cls)
    except _Unsupported:
        return _pydantic
    compiled: Dumper = compiler.names[name]
    return compiled


_DUMPERS: dict[type, Dumper] = {}


def dump_data(data: BaseModel) -> Any:
    """``data`` as the ``data`` dict of its record, exactly as pydantic's JSON mode
    gives it (by alias)."""
    try:
        return _DUMPERS[type(data)](data)
    except _Slow:
        return _pydantic(data)
    except KeyError:
        if type(data) in _DUMPERS:  # a field missing (an instance made by model_construct)
            return _pydantic(data)
    _DUMPERS[type(data)] = compile_dumper(type(data))
    return dump_data(data)
