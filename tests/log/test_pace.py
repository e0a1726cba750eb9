"""Long work a slice at a time (sessiond.log.pace): the paced forms give exactly what
the one-piece forms give, and the collector is left as it was found."""

from __future__ import annotations

import gc
from pathlib import Path

import orjson

from sessiond.log.pace import collector_paused, encode_paced, release
from sessiond.log.replay import replay_all
from tests.helpers import arun

GOLDEN = Path(__file__).parent.parent / "golden"


def test_a_state_encoded_a_slice_at_a_time_is_the_one_piece_encoding() -> None:
    records = [
        orjson.loads(line.rsplit(b" ", 1)[0])
        for line in (GOLDEN / "v1" / "golden.jsonl").read_bytes().splitlines()
    ]
    state = replay_all("golden", records)
    # long enough that lists and dicts are encoded in batches
    state.transcript = [
        {"seq": n, "role": "user", "kind": "message", "text": f"t{n}"} for n in range(1000)
    ]
    state.file_hashes = {f"f{n}": None for n in range(700)}
    assert arun(encode_paced(state)) == orjson.dumps(state)
    assert arun(encode_paced(replay_all("empty", []))) == orjson.dumps(replay_all("empty", []))


def test_the_collector_is_paused_and_then_as_it_was() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: still off inside, back on after the outer
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # found off: left off
    finally:
        gc.enable()


def test_release_empties_a_list_a_batch_at_a_time() -> None:
    items = list(range(10_000))
    arun(release(items))
    assert items == []
