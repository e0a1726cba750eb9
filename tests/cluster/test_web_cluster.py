"""The web console of any node shows and acts on the whole cluster (docs/design.md
sections 10 and 11), as `sessionctl` on that node's socket does: its table and
inbox list every node's sessions with their node, a session another node runs
has its page, and an action on it is the same syscall carried to its owner,
recorded there with the web user. Two real nodes, one real PostgreSQL, the
console over HTTP."""

from __future__ import annotations

import http.client
import os
import pwd
import shutil
import urllib.parse
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.cluster.conftest import HELLO, SHARED, lease
from tests.e2e.harness import Daemon, short_dir, wait_event
from tests.e2e.webclient import WEB, Client, logged_in

ASKS = """name = "asks"
labels = { team = "red" }
[run]
exec = ["sh", "-c", "echo ran >> asks.txt"]
cwd = "."
writes = ["asks.txt"]
[policy]
ask = ["command"]
"""

PLAIN = """name = "plain"
[run]
exec = ["sh", "-c", "echo ran >> plain.txt"]
cwd = "."
writes = ["plain.txt"]
"""


@pytest.fixture
def two(pg_dsn: str) -> Iterator[list[Daemon]]:
    """n1 with a web console, n2 without one."""
    nodes: list[Daemon] = []
    try:
        for i, web in ((1, WEB), (2, "")):
            config = f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n{i}"\n{lease(False)}{SHARED}'
            nodes.append(Daemon(short_dir(), config + web).start())
        yield nodes
    finally:
        for d in nodes:
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)


class Stream:
    """A console's server-sent events, read as a browser's EventSource would."""

    def __init__(self, client: Client, path: str) -> None:
        url = urllib.parse.urlsplit(client.base)
        self.conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        self.conn.request("GET", path, headers={"Cookie": f"sessiond_login={client.cookie}"})
        self.res = self.conn.getresponse()
        assert self.res.status == 200, self.res.read()

    def next(self, name: str) -> Any:
        """The next ``name`` event's data (a socket timeout bounds the wait)."""
        event = ""
        while line := self.res.readline():
            if line.startswith(b"event: "):
                event = line[7:].strip().decode()
            elif line.startswith(b"data: ") and event == name:
                return orjson.loads(line[6:])
        raise AssertionError(f"the stream ended before a {name} event")

    def close(self) -> None:
        self.conn.close()


def terminated(r: dict[str, Any]) -> bool:
    return bool(r["data"]["to"] == "terminated")


def test_the_console_of_one_node_lists_and_answers_a_session_another_node_runs(
    two: list[Daemon],
) -> None:
    n1, n2 = two
    n1.ctl("create", str(n1.write_spec("hello", HELLO)), check=True)
    n2.ctl("create", str(n2.write_spec("asks", ASKS)), check=True)
    n2.ctl("create", str(n2.write_spec("plain", PLAIN)), check=True)
    n2.ctl("activate", "asks", check=True)
    asked = wait_event(n2, "asks", "approval.requested")
    web = logged_in(n1)

    table = web.get("/api/sessions").json()
    rows = {r["name"]: r for r in table["rows"]}
    assert set(rows) == {"asks", "hello", "plain"}, rows
    assert (rows["asks"]["node"], rows["hello"]["node"], rows["plain"]["node"]) == (
        "n2",
        "n1",
        "n2",
    )
    assert rows["asks"]["state"] == "blocked"  # its owner's own row
    assert rows["asks"]["pending_approvals"] == 1
    assert table["sessions"] == 3
    assert b"<th>node</th>" in web.get("/").body  # the table has a node column here
    blocked = web.get("/api/sessions?state=blocked").json()["rows"]
    assert [r["name"] for r in blocked] == ["asks"]
    red = web.get("/api/sessions?label=team%3Dred").json()["rows"]
    assert [r["name"] for r in red] == ["asks"]

    inbox = web.get("/api/approvals").json()
    assert [(i["session"], i["node"], i["call"]) for i in inbox] == [
        ("asks", "n2", asked["data"]["call"])
    ]
    assert b"asks" in web.get("/inbox").body

    page = web.get("/s/asks")
    assert page.status == 200, page.body[:400]
    assert b"Waiting for approval" in page.body  # its pending approval, with the buttons
    assert b'<dd id="node">n2</dd>' in page.body  # where it runs
    assert web.get(f"/approvals/asks/{asked['data']['call']}").status == 200
    timeline = web.get("/api/s/asks/events?type=approval.requested").json()
    assert [r["seq"] for r in timeline] == [asked["seq"]]
    assert web.get("/api/s/asks/messages").status == 200

    table_stream = Stream(web, "/api/sessions/stream")
    live = {r["name"]: r["node"] for r in table_stream.next("page")["rows"]}
    table_stream.close()
    assert live == {"asks": "n2", "hello": "n1", "plain": "n2"}
    page_stream = Stream(web, "/api/s/asks/stream")  # the page follows n2's commits

    answer = web.act("/api/s/asks/approve", {"note": "from n1's console"})
    assert answer.status == 200, answer.body
    granted = wait_event(n2, "asks", "approval.granted")
    assert granted["node"] == "n2"  # carried out by its owner
    assert granted["data"]["channel"] == "web"
    assert granted["data"]["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert granted["data"]["by"] == "from n1's console"
    end = wait_event(n2, "asks", "lifecycle.changed", match=terminated)
    try:
        while (changed := page_stream.next("changed"))["seq"] < end["seq"]:
            pass
    finally:
        page_stream.close()
    assert changed["state"] == "terminated"
    again = web.act("/api/s/asks/approve", {})  # the owner's refusal, as on its console
    assert again.status == 409, again.body
    assert (n2.root / "asks.txt").read_text() == "ran\n"  # run exactly once

    started = web.act("/api/s/plain/activate")
    assert started.status == 200, started.body
    done = wait_event(n2, "plain", "lifecycle.changed", match=terminated)
    assert done["node"] == "n2"
    assert web.act("/api/s/nobody/activate").status == 404  # in no node's table
    assert web.get("/s/nobody").status == 404
