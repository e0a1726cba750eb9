"""`sessionctl log S --follow` on any node of a cluster (docs/design.md section 10: any
node's socket serves the whole cluster): the events of a session another node
runs, as they are committed, with the owner's output and flags, and on across a
take-over with no gap and no duplicate. Three real nodes, one real PostgreSQL,
the real sessionctl."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from typing import Any

import orjson
import psycopg
import pytest

from tests.cluster.conftest import HELLO, TTL, taken_over
from tests.e2e.harness import SESSIONCTL, Daemon, wait_event, wait_for


class Follower:
    """A real `sessionctl log … --follow` on one node, its lines read as they come."""

    def __init__(self, node: Daemon, *args: str, json: bool = True) -> None:
        command = [SESSIONCTL, *(["--json"] if json else []), "log", *args, "--follow"]
        self.json = json
        self.proc = subprocess.Popen(
            command, env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: list[Any] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = orjson.loads(raw) if self.json else raw.decode().rstrip("\n")
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait(self, found: Callable[[Any], bool], what: str, timeout: float = 30.0) -> Any:
        """The first line ``found`` accepts, waiting for it (woken by each line)."""

        def look() -> Any:
            return next((line for line in self.lines if found(line)), None)

        with self._changed:
            self._changed.wait_for(
                lambda: look() is not None or not self._reader.is_alive(), timeout
            )
            line = look()
        if line is None:
            ended = self.proc.poll() is not None and self.proc.stderr is not None
            err = self.proc.stderr.read().decode() if ended and self.proc.stderr else ""
            raise AssertionError(f"no {what} in {self.lines[-5:]} {err}")
        return line

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def _text(record: dict[str, Any], text: str) -> bool:
    return bool(record["type"] == "message.received" and record["data"]["text"] == text)


@pytest.mark.short_lease("n2")
def test_follow_on_a_node_of_a_session_another_runs_goes_on_across_its_failover(
    three: list[Daemon], pg_dsn: str
) -> None:
    n1, n2, n3 = three
    n2.ctl("create", str(n2.write_spec("hello", HELLO)), check=True)
    follower = Follower(n1, "hello")
    try:
        created = follower.wait(lambda r: r["type"] == "session.created", "session.created")
        assert created["node"] == "n2"
        n3.ctl("send", "hello", "one", check=True)
        follower.wait(lambda r: _text(r, "one"), "the first message")
        ran = follower.wait(lambda r: r["type"] == "run.finished", "n2's run")
        assert ran["node"] == "n2"

        # n1 drains, so that n3 (not the follower's own node) takes the session over
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            n1.ctl("drain", "n1", check=True)
            row = conn.execute("SELECT now()").fetchone()
            assert row is not None

            def told() -> bool:
                got = conn.execute(
                    "SELECT renewed_at > %s FROM nodes WHERE name = 'n1'", (row[0],)
                ).fetchone()
                return got is not None and bool(got[0])

            wait_for(told, what="n1 renewing its lease as draining")
        n2.kill9()
        wait_for(lambda: taken_over([n3], "hello"), timeout=TTL + 30, what="n3's take-over")
        n1.ctl("send", "hello", "two", check=True)  # carried to n3 through the database
        after = follower.wait(lambda r: _text(r, "two"), "the message after the take-over")
        assert after["node"] == "n3"
        last = follower.wait(
            lambda r: r["type"] == "run.finished" and r["node"] == "n3", "n3's run"
        )
    finally:
        follower.close()
    seen = [r["seq"] for r in follower.lines]
    assert seen == list(range(1, len(seen) + 1)), seen  # every seq once, in order: no gap
    assert last["seq"] in seen
    logged = n3.json("log", "hello")[: len(seen)]
    assert [r["id"] for r in follower.lines] == [r["id"] for r in logged]
    epochs = [r["epoch"] for r in follower.lines]
    assert epochs == sorted(epochs)
    assert {r["node"] for r in follower.lines} == {"n2", "n3"}
    # the client's going ends the stream on n1 at once (not at a next event)
    n1.wait_line("follow.ended", match=lambda line: line.get("session") == "hello")


def test_a_follow_on_another_node_gives_the_owners_output_with_its_flags(
    three: list[Daemon],
) -> None:
    n1, n2, n3 = three
    n2.ctl("create", str(n2.write_spec("hello", HELLO)), check=True)
    for text in ("alpha", "bravo"):
        n2.ctl("send", "hello", text, check=True)
        wait_event(n2, "hello", "message.received", match=lambda r, t=text: r["data"]["text"] == t)
    flags = ("hello", "--type", "message.received", "-n", "1")
    here, there = Follower(n2, *flags, json=False), Follower(n1, *flags, json=False)
    remote_json = Follower(n1, "hello", "--type", "message.received", "--since", "2")
    try:
        for f in (here, there):
            f.wait(lambda line: line.endswith(": bravo"), "the last message of the backlog")
        n3.ctl("send", "hello", "charlie", check=True)
        for f in (here, there):
            f.wait(lambda line: line.endswith(": charlie"), "the new message")
        got = remote_json.wait(lambda r: r["data"]["text"] == "charlie", "the new message")
    finally:
        for f in (here, there, remote_json):
            f.close()
    assert there.lines == here.lines  # the same lines as on the owner's socket
    assert len(there.lines) == 2  # -n 1: the last of the backlog, then the new one
    assert there.lines[0].endswith(": bravo")
    assert [r["data"]["text"] for r in remote_json.lines] == ["alpha", "bravo", "charlie"]
    assert got["node"] == "n2"
    missing = subprocess.run(
        [SESSIONCTL, "log", "nobody", "--follow"],
        env=n1.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 4, missing.stderr  # no such session anywhere
