"""A table index whose lines are JSON but whose rows are not ps rows (a damaged
cache, or one written by something else): the early server, which lists ps from
the index before the daemon has loaded anything, must not take the start down
with it. The index is a cache, never the truth: such an entry is skipped, its
session opened from its log, and ps answers from there. Real daemon, real
sessionctl; nothing waits on time."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import orjson
import pytest

from tests.e2e.harness import Daemon, short_dir

PLAIN = 'name = "{name}"\n[run]\nexec = ["true"]\n'

# what each damage puts in a's row: every one is a JSON value no ps row holds
DAMAGE = [
    {"state": "terminated", "last_active": 5},  # what the default listing reads first
    {"labels": ["t"]},
    {"priority": "high"},
    {"state": None},
    {"agent": {"x": 1}},
]


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    root = short_dir()
    d = Daemon(root)
    try:
        d.start()
        for name in ("a", "b"):
            d.ctl("create", str(d.write_spec(name, PLAIN.format(name=name))), check=True)
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("damage", DAMAGE, ids=",".join)
def test_a_row_that_is_no_ps_row_does_not_stop_the_start(
    daemon: Daemon, damage: dict[str, object]
) -> None:
    d = daemon
    rows = d.json("ps", "--all")
    d.stop()  # a clean stop writes the index whole: one line a session
    index = d.state_dir / "table.index"
    lines = index.read_bytes().split(b"\n")
    for i, line in enumerate(lines):
        entry = orjson.loads(line) if line.startswith(b'{"name":"a"') else None
        if entry is not None:
            entry["row"].update(damage)  # its stamps still match the log: only the row is bad
            lines[i] = orjson.dumps(entry)
    assert any(line.startswith(b'{"name":"a"') for line in lines)
    index.write_bytes(b"\n".join(lines))
    since = len(d.lines)
    d.start()
    assert d.json("ps", "--all") == rows  # a's row from its log, not the damaged one
    assert d.json("ps", "--sort", "priority") == sorted(rows, key=lambda r: r["name"])
    # the early server served, from the index less the entry it could not use
    read = next(line for line in d.lines[since:] if line.get("event") == "index.read")
    assert (read["entries"], read["opened_first"]) == (1, 1)
    listening = next(
        line for line in d.lines[since:]
        if line.get("event") == "server.listening" and line.get("endpoint") == "control"
    )  # fmt: skip
    assert "early_answered" in listening  # taken over from the early server
