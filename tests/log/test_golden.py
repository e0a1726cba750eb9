"""Logs written by every published version stay readable.

``tests/golden/v<N>/golden.jsonl`` holds one event of every type as version N
wrote them (see ``tests/golden/write_current.py``). Each must still decode with
full validation (after upcasting) and replay to the state recorded beside it.
When the fold's meaning changes on purpose, bump REDUCER_VERSION and update the
``*.state.json`` files; never edit a ``golden.jsonl``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from sessiond.log.events import EVENT_TYPES, decode
from sessiond.log.replay import replay_all
from sessiond.log.store.files import FileStore
from tests.helpers import arun

GOLDEN = Path(__file__).parent.parent / "golden"
VERSIONS = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir() and p.name.startswith("v"))


def test_there_is_a_golden_log_for_version_one() -> None:
    assert "v1" in VERSIONS


def test_every_event_type_is_in_a_golden_log() -> None:
    """A type added within a version gets a golden folder of its own (v1-spec-applied)."""
    seen = set()
    for version in VERSIONS:
        for line in (GOLDEN / version / "golden.jsonl").read_bytes().splitlines():
            seen.add(orjson.loads(line.rsplit(b" ", 1)[0])["type"])
    assert seen == set(EVENT_TYPES)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_golden_log_decodes_and_replays_to_its_state(version: str, state_dir: Path) -> None:
    store = FileStore(state_dir)
    arun(_create(store))
    shutil.copyfile(GOLDEN / version / "golden.jsonl", store.log_path("golden"))

    records = list(store.read("golden"))
    assert {r["type"] for r in records} <= set(EVENT_TYPES)
    for record in records:
        decode(record)  # full validation, never the fast path
    state = replay_all("golden", records)
    expected = orjson.loads((GOLDEN / version / "golden.state.json").read_bytes())
    assert orjson.loads(orjson.dumps(state)) == expected


async def _create(store: FileStore) -> None:
    await (await store.create("golden")).close()
