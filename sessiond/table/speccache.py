"""A session's validated spec, kept beside it: ``spec.cache.json``.

Parsing a spec's TOML and validating it costs more than loading the session's
snapshot, and a start-up does it for every session; so the table keeps the
validated spec as JSON beside ``spec.toml``::

    <sha256 hex of spec.toml's bytes, a newline, and the JSON below>\\n
    <the validated spec, as SessionSpec.model_dump_json()>

The digest covers both the spec it was made from and the JSON itself. A cache
whose digest does not match (an edited spec.toml, a torn or edited cache, one
written by an older version, which hashed the spec only) is never used: the spec
is parsed and validated again from ``spec.toml`` (the truth) and the cache
rewritten. A cache that matches holds exactly what this daemon validated and
wrote, so it is not validated a second time: the spec is put together from the
JSON, the parts that are models (run, budget, policy, triggers...) validated once
for each distinct value and shared by every session whose cache holds the same
(thousands of sessions made from one template share them all). Who can write the
cache can write the log and the spec beside it: the state dir is the daemon's own
(0700), the digest is a check against damage, not a signature.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import orjson

from sessiond.errors import StorageError
from sessiond.log.store.durable import read_regular, write_all
from sessiond.log.store.files import SPEC_LIMIT
from sessiond.table.spec import SessionSpec, parse_spec

SPEC_CACHE = "spec.cache.json"

# The fields whose JSON is the validated value itself (text, numbers, lists and
# tables of text): taken as they are. Every other field is a model, or holds some.
PLAIN: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "goal": str,
    "description": str,
    "agent": str,
    "priority": int,
    "labels": dict,
    "node": (str, type(None)),
    "node_labels": dict,
    "redact": list,
}
NESTED = tuple(name for name in SessionSpec.model_fields if name not in PLAIN)
# A spec's fields, once (pydantic's ``model_fields`` costs a deprecation check at
# each read, a few per cent of opening a session at a start-up).
FIELDS = SessionSpec.model_fields.keys()
SHARED_LIMIT = 4096  # distinct nested parts kept (a start-up from templates has a few)

# the models of a nested part (by its JSON), shared by every session that holds it
_shared: dict[bytes, dict[str, object]] = {}


def digest(spec: bytes, body: bytes) -> str:
    return hashlib.sha256(spec + b"\n" + body).hexdigest()


def stored_spec(folder: str, name: str, text: str) -> SessionSpec:
    """The spec of the session in ``folder`` whose ``spec.toml`` reads ``text``:
    from its cache when the cache's digest matches, else parsed and validated (and
    the cache written). Raises BadSpec as parse_spec does."""
    spec_bytes = text.encode()
    cache = f"{folder}/{SPEC_CACHE}"
    try:
        # not through a symlink planted in its place: that could feed another spec
        raw = read_regular(cache, limit=4 * SPEC_LIMIT)
    except (OSError, StorageError):
        raw = b""
    if raw[64:65] == b"\n" and raw[:64] == digest(spec_bytes, raw[65:]).encode():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            return from_cache(raw[65:])
    spec = parse_spec(text, base=Path("/"), source=f"{name}/spec.toml")
    body = spec.model_dump_json().encode()
    # A cache needs no fsync: a torn one fails its digest and is rebuilt.
    with contextlib.suppress(OSError):
        tmp = f"{folder}/.{SPEC_CACHE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            write_all(fd, digest(spec_bytes, body).encode() + b"\n" + body)
        finally:
            os.close(fd)
        os.replace(tmp, cache)
    return spec


def from_cache(body: bytes) -> SessionSpec:
    """The spec a matching cache holds (see the module's docstring). ValueError,
    TypeError or KeyError if the JSON is not a spec's."""
    data = orjson.loads(body)
    if not isinstance(data, dict) or data.keys() != FIELDS:
        raise ValueError("not a whole spec")
    key = orjson.dumps([data[field] for field in NESTED])
    nested = _shared.get(key)
    if nested is None:
        # validated as a whole (the model validators see the spec), once per value
        checked = SessionSpec.model_validate_json(body)
        nested = {field: getattr(checked, field) for field in NESTED}
        if len(_shared) >= SHARED_LIMIT:
            _shared.clear()
        _shared[key] = nested
        return checked
    for field, kind in PLAIN.items():
        if not isinstance(data[field], kind):
            raise TypeError(f"{field} is not {kind}")
    data.update(nested)  # (the keys keep their places: the fields' order, as dumped)
    return _construct(data)


_setattr = object.__setattr__


def _construct(values: dict[str, object]) -> SessionSpec:
    """``SessionSpec.model_construct(**values)`` for ``values`` that hold every field
    in order: what it does then, without its search for each field's aliases and
    default (a third of the opening of a spec). Through model_construct itself
    should the model ever need more (a post-init, private attributes)."""
    if SessionSpec.__pydantic_post_init__ or SessionSpec.__private_attributes__:
        construct: Callable[..., SessionSpec] = SessionSpec.model_construct
        return construct(**values)
    spec = SessionSpec.__new__(SessionSpec)
    _setattr(spec, "__dict__", values)
    _setattr(spec, "__pydantic_fields_set__", set(values))
    _setattr(spec, "__pydantic_extra__", None)
    _setattr(spec, "__pydantic_private__", None)
    return spec
