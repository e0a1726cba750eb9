"""The spec cache beside each session (sessiond.table.speccache): used only when its
digest matches the spec and the cache's own JSON, otherwise refused (the spec is
parsed and validated again from spec.toml, the truth)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from sessiond.config import DaemonConfig
from sessiond.log.store.files import FileStore
from sessiond.table import speccache
from sessiond.table.sessions import Table
from sessiond.table.spec import BadSpec, SessionSpec, load_spec_file, parse_spec
from sessiond.table.speccache import SPEC_CACHE, digest, from_cache, stored_spec

EXAMPLES = sorted(Path(__file__).resolve().parents[2].glob("examples/*/*.toml"))
SPEC = 'name = "a"\ngoal = "the goal"\nagent = "claude"\npriority = 5\n'


def cached(folder: Path) -> tuple[bytes, bytes]:
    raw = (folder / SPEC_CACHE).read_bytes()
    return raw[:64], raw[65:]


def test_a_cache_is_written_then_used_and_matches_a_full_validation(tmp_path: Path) -> None:
    first = stored_spec(str(tmp_path), "a", SPEC)
    header, body = cached(tmp_path)
    assert header == digest(SPEC.encode(), body).encode()
    again = stored_spec(str(tmp_path), "a", SPEC)
    assert again == first == parse_spec(SPEC, base=Path("/"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_a_spec_put_together_from_its_cache_is_the_validated_one(path: Path) -> None:
    """Every example spec: the first time through validation, the next times put
    together from the shared nested parts; the same spec either way."""
    spec, _ = load_spec_file(path)
    body = spec.model_dump_json().encode()
    speccache._shared.clear()
    checked = SessionSpec.model_validate_json(body)
    for _ in range(2):
        made = from_cache(body)
        assert made == checked
        assert made.model_dump_json() == checked.model_dump_json()
        assert made.model_fields_set == checked.model_fields_set
        assert list(vars(made)) == list(vars(checked))


def test_a_tampered_cache_is_refused_and_the_spec_parsed_again(tmp_path: Path) -> None:
    """Its JSON edited, its digest left as it was (the old cache hashed the spec
    only, and served any JSON that validated): the table takes the spec from
    spec.toml, and makes the cache again."""
    table = Table(DaemonConfig(state_dir=tmp_path, socket=tmp_path / "s.sock"), FileStore(tmp_path))
    folder = tmp_path / "sessions" / "a"
    folder.mkdir(parents=True)
    table._parse_stored_spec("a", SPEC)
    header, body = cached(folder)
    forged = body.replace(b'"the goal"', b'"a forged goal"')
    forged = forged.replace(b'"priority":5', b'"priority":99')
    assert forged != body
    (folder / SPEC_CACHE).write_bytes(header + b"\n" + forged)
    spec = table._parse_stored_spec("a", SPEC)
    assert (spec.goal, spec.priority) == ("the goal", 5)
    assert cached(folder)[1] == body


def test_a_cache_of_another_spec_or_of_the_old_kind_is_not_used(tmp_path: Path) -> None:
    stored_spec(str(tmp_path), "a", SPEC)
    edited = SPEC.replace("the goal", "a new goal")
    assert stored_spec(str(tmp_path), "a", edited).goal == "a new goal"
    # the old kind: the spec's digest alone, before any JSON (written by 0.x daemons)
    _, body = cached(tmp_path)
    old = hashlib.sha256(SPEC.encode()).hexdigest().encode()
    (tmp_path / SPEC_CACHE).write_bytes(old + b"\n" + body.replace(b"a new goal", b"stale"))
    assert stored_spec(str(tmp_path), "a", SPEC).goal == "the goal"
    header, body = cached(tmp_path)
    assert header == digest(SPEC.encode(), body).encode()


def test_a_cache_that_matches_but_is_no_spec_is_refused(tmp_path: Path) -> None:
    """A digest that matches JSON which is not a whole spec (a field missing, a wrong
    type, not an object): never put together; the spec is validated from spec.toml."""
    for body in (
        b"[]",
        b'{"name":"a"}',
        orjson.dumps({**orjson.loads(_body(tmp_path)), "goal": 3}),
    ):
        (tmp_path / SPEC_CACHE).write_bytes(digest(SPEC.encode(), body).encode() + b"\n" + body)
        assert stored_spec(str(tmp_path), "a", SPEC) == parse_spec(SPEC, base=Path("/"))


def test_a_bad_spec_is_refused_whatever_the_cache_says(tmp_path: Path) -> None:
    stored_spec(str(tmp_path), "a", SPEC)
    bad = 'name = "a"\npriority = 500\n'
    with pytest.raises(BadSpec, match="priority"):
        stored_spec(str(tmp_path), "a", bad)


def _body(folder: Path) -> bytes:
    stored_spec(str(folder), "a", SPEC)
    return cached(folder)[1]
