"""Memory bounded in log length, through the real daemon: a long session loads into
the same state as a short one (its snapshot is the same size), and its messages
view and ``sdk.context`` come a page at a time, built from the log."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiond.bench.memory import write_state
from sessiond.log.projections import PAGE_DEFAULT, messages
from sessiond.log.store.files import FileStore
from sessiond.sdkwire import Message
from sessiond.wire import Connection, RemoteError
from tests.e2e.harness import Daemon, short_dir, wait_event

# Runs of 21 events after 2 of creation, then 9 messages: both logs end alike.
LONG, SHORT = 2 + 21 * 600 + 9, 2 + 21 * 60 + 9

PROGRAM = """
import json
from sessiond.sdk import connect
with connect() as run:
    ctx = run.context()
    raw = run._call("sdk.context")  # what one answer of the daemon holds: a page
    summary = {"n": len(ctx["messages"]), "first": ctx["messages"][0],
               "last": ctx["messages"][-1], "keys": sorted(ctx), "mailbox": len(ctx["mailbox"]),
               "page": len(raw["messages"]), "next": raw["next_cursor"]}
    open("context.json.tmp", "w").write(json.dumps(summary))
    __import__("os").rename("context.json.tmp", "context.json")
    run.sleep()
"""


def _view(state_dir: Path, name: str) -> list[Message]:
    return messages(list(FileStore(state_dir).read(name)), name)


def _snapshot_bytes(state_dir: Path, name: str) -> int:
    (snap,) = (state_dir / "sessions" / name / "snapshots").iterdir()
    return snap.stat().st_size


@pytest.fixture
def d() -> Any:
    daemon = Daemon(short_dir())
    try:
        yield daemon
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        shutil.rmtree(daemon.root, ignore_errors=True)


def test_a_long_session_loads_into_a_state_no_bigger_than_a_short_ones(d: Daemon) -> None:
    write_state(d.state_dir, 1, LONG)  # s00000
    write_state(d.state_dir, 1, SHORT, first=1)  # s00001
    expected = _view(d.state_dir, "s00000")
    assert len(expected) > 2 * PAGE_DEFAULT  # pages of the view
    d.start()

    # the whole view through sessionctl, which pages through it
    assert d.json("replay", "s00000", "--view", "messages") == expected
    text = d.ctl("replay", "s00000", "--view", "messages", check=True).stdout.splitlines()
    assert len(text) == len(expected)
    assert text[-1].endswith(expected[-1]["content"])

    # one page at a time over the socket
    with Connection(d.socket) as conn:
        page = conn.call("replay", {"name": "s00000", "view": "messages", "limit": 2})
        assert page["messages"] == expected[:2]
        assert page["next_cursor"] == expected[1]["seq"]
        after = conn.call(
            "replay",
            {"name": "s00000", "view": "messages", "limit": 3, "cursor": page["next_cursor"]},
        )
        assert after["messages"] == expected[2:5]
        last = conn.call(
            "replay", {"name": "s00000", "view": "messages", "cursor": expected[-2]["seq"]}
        )
        assert last == {"messages": expected[-1:], "next_cursor": None, "upto": LONG}
        with pytest.raises(RemoteError, match="limit"):
            conn.call("replay", {"name": "s00000", "view": "messages", "limit": 0})
        with pytest.raises(RemoteError, match="page the messages view only"):
            conn.call("replay", {"name": "s00000", "view": "state", "cursor": 5})
        assert conn.call("ping", {})  # refused requests left the daemon serving

    # a clean stop snapshots each session: the long one's is the short one's size
    d.stop()
    long, short = _snapshot_bytes(d.state_dir, "s00000"), _snapshot_bytes(d.state_dir, "s00001")
    assert long <= short * 1.1, (long, short)
    assert long < 20_000


def test_sdk_context_pages_through_a_long_view(d: Daemon) -> None:
    """The program gets every message of a view three pages long; the daemon never
    built it whole."""
    write_state(d.state_dir, 1, LONG)
    name = "s00000"
    folder = d.state_dir / "sessions" / name
    program = d.root / "program.py"
    program.write_text(PROGRAM)
    root = Path(__file__).parents[2]
    (folder / "spec.toml").write_text(
        f'name = "{name}"\ngoal = "memory benchmark"\n[run]\nkind = "sdk"\n'
        f'exec = ["{sys.executable}", "{program}"]\ncwd = "{d.root}"\n'
        f'env = {{ PYTHONPATH = "{root}" }}\n'
    )
    expected = _view(d.state_dir, name)
    d.start()
    # The written log's tool calls changed a file this workspace does not have: the
    # gate blocks the wake, and the person accepts the workspace as it is.
    assert "blocked" in d.ctl("activate", name, check=True).stdout
    d.ctl("resolve", name, "--accept", check=True)
    done = wait_event(d, name, "run.finished", since=LONG + 1, timeout=60)
    assert done["data"]["status"] == "ok", done
    seen = orjson.loads((d.root / "context.json").read_bytes())
    assert seen["n"] == len(expected)
    assert seen["first"] == expected[0]
    assert seen["last"] == expected[-1]
    assert "next_cursor" not in seen["keys"]
    assert seen["page"] == PAGE_DEFAULT  # the daemon sent it a page at a time
    assert seen["next"] == expected[PAGE_DEFAULT - 1]["seq"]
    assert seen["mailbox"] == 9  # the messages since the last run, text and all
    assert seen["last"]["content"] == "later"
