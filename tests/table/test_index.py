"""The table index (sessiond.table.index): its lines, and its check against the logs."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from sessiond.replies import PsRow
from sessiond.table import indexfile
from sessiond.table.index import HEADER, Entry, IndexKeeper, plan, read_index, stamp
from sessiond.table.indexfile import read_checked


def row(name: str, state: str = "sleeping") -> PsRow:
    return {
        "name": name, "state": state, "reason": "", "agent": "", "priority": 0, "runs": 0,
        "last_active": None, "next_wake": None, "pid": None, "parent": None, "outcome": None,
        "labels": {},
    }  # fmt: skip


def session(sessions: Path, name: str, log: bytes = b"line\n") -> Entry:
    """A session folder with a log and a spec, and the entry that vouches for it."""
    folder = sessions / name
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_bytes(log)
    (folder / "spec.toml").write_text(f'name = "{name}"\n')
    log_stamp = stamp(str(folder / "events.jsonl"))
    assert log_stamp is not None
    return {
        "name": name,
        "seq": 1,
        "log": log_stamp,
        "spec": stamp(str(folder / "spec.toml")),
        "busy": False,
        "wake_at": None,
        "row": row(name),
    }


def write(path: Path, *lines: bytes) -> None:
    path.write_bytes(HEADER + b"".join(line + b"\n" for line in lines))


def test_a_later_line_wins_and_a_torn_or_foreign_one_is_skipped(tmp_path: Path) -> None:
    a = session(tmp_path / "sessions", "a")
    b = session(tmp_path / "sessions", "b")
    newer = {**a, "seq": 2}
    bad_name = {**b, "name": "../x", "row": {**b["row"], "name": "../x"}}
    path = tmp_path / "table.index"
    write(
        path,
        orjson.dumps(a),
        orjson.dumps(b),
        orjson.dumps(newer),
        b'{"name": "c", "seq": 1',  # torn by a crash
        orjson.dumps(bad_name),
        orjson.dumps({**b, "log": ["x", 1, 2]}),  # not a stamp: skipped, b's line stands
    )
    entries, lines = read_index(path)
    assert sorted(entries) == ["a", "b"]
    assert entries["a"]["seq"] == 2
    assert entries["b"] == b
    assert lines == 6


def test_an_index_that_is_not_one_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "table.index"
    path.write_bytes(b'{"name": "a"}\n')
    assert read_index(path) == ({}, 0)
    assert read_index(tmp_path / "none") == ({}, 0)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(HEADER)
    assert read_index(path) == ({}, 0)  # a planted symlink is not read through


def test_the_log_wins_over_its_entry(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    fresh = session(sessions, "fresh")
    appended = session(sessions, "appended")
    respecced = session(sessions, "respecced")
    busy = session(sessions, "busy")
    busy["busy"] = True
    session(sessions, "unlisted")
    gone = session(sessions, "gone")
    with open(sessions / "appended" / "events.jsonl", "ab") as f:
        f.write(b"one more\n")
    spec = sessions / "respecced" / "spec.toml"
    spec.write_text('name = "respecced"\ngoal = "edited"\n')
    (sessions / "gone" / "events.jsonl").unlink()
    (sessions / ".new-half").mkdir()  # a create cut off: not a session
    entries = {e["name"]: e for e in (fresh, appended, respecced, busy, gone)}
    planned = plan(sessions, entries)
    assert list(planned["rest"]) == ["fresh"]
    assert planned["first"] == ["appended", "busy", "respecced", "unlisted"]


def test_a_log_cut_back_to_the_same_size_is_stale_too(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    entry = session(sessions, "a", b"0123456789\n")
    log = sessions / "a" / "events.jsonl"
    log.unlink()
    log.write_bytes(b"abcdefghij\n")  # another file: the same size
    assert plan(sessions, {"a": entry})["first"] == ["a"]


def test_the_rest_opens_in_order_of_the_next_timed_wake(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    entries: dict[str, Entry] = {}
    for name, wake_at in (("a", None), ("b", 300.0), ("c", 100.0), ("d", None)):
        entries[name] = session(sessions, name)
        entries[name]["wake_at"] = wake_at
    assert list(plan(sessions, entries)["rest"]) == ["c", "b", "a", "d"]


def test_the_keeper_appends_changes_and_rewrites_whole(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    live = {name: session(sessions, name) for name in ("a", "b")}
    path = tmp_path / "table.index"

    def entry_of(name: str) -> Entry | None:
        return live.get(name)

    keeper = IndexKeeper(path, sessions, entry_of, lambda: [*live, "pending"])
    keeper.kept["pending"] = session(sessions, "pending")  # read at start, not opened since
    keeper.note("a")
    keeper.note("gone")
    keeper.flush()
    entries, lines = read_index(path)
    assert (sorted(entries), lines) == (["a"], 1)
    live["a"] = {**live["a"], "seq": 7}
    keeper.note("a")
    keeper.flush()
    entries, lines = read_index(path)
    assert (entries["a"]["seq"], lines) == (7, 2)
    keeper.write_whole(durable=True)
    entries, lines = read_index(path)
    assert (sorted(entries), lines) == (["a", "b", "pending"], 3)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_the_early_servers_read_is_a_fresh_read_and_check(tmp_path: Path) -> None:
    # read_checked is what the early server hands the full start, which then reads
    # nothing again: it must say what reading and planning say, warnings included
    sessions = tmp_path / "sessions"
    fresh = session(sessions, "fresh")
    stale = session(sessions, "stale")
    session(sessions, "unlisted")
    with open(sessions / "stale" / "events.jsonl", "ab") as f:
        f.write(b"one more\n")  # its log moved past its entry: opened (recovered) first
    path = tmp_path / "table.index"
    write(path, orjson.dumps(fresh), orjson.dumps(stale), b'{"name": "torn"')
    read = read_checked(path, sessions)
    warned: list[tuple[str, object]] = []
    entries, lines = indexfile.read_index(path, lambda e, f: warned.append((e, f)))
    assert (read.path, read.sessions_dir) == (path, sessions)
    assert (read.entries, read.lines) == (entries, lines) == (read.entries, 3)
    assert read.planned == plan(sessions, entries)
    assert read.planned["first"] == ["stale", "unlisted"]
    assert list(read.planned["rest"]) == ["fresh"]
    assert read.warnings == warned == [("index.lines_skipped", {"path": str(path), "lines": 1})]
