"""Any node's socket serves the whole cluster (docs/design.md section 10): `ps` lists
every session with its node, and a syscall for a session another node owns is
carried out there, with the caller's identity. Three real nodes, one real
PostgreSQL."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sessiond.cluster.lease import LEASE_LOST_EXIT
from tests.cluster.conftest import HELLO, SHARED, node_name, nodes_of, taken_over
from tests.e2e.harness import SESSIONCTL, Daemon, wait_event, wait_for

ASKS = """name = "asks"
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

SENDER = """name = "sender"
[run]
kind = "sdk"
exec = ["{python}", "sender.py"]
cwd = "."
"""

SENDER_PROGRAM = """from sessiond.sdk import connect
with connect() as run:
    run.send("hello", "from a program on n1")
"""

# A run's process on n1 tries to approve through n2's socket (an operator action).
SNEAKY = """name = "sneaky"
[run]
exec = ["sh", "-c", "{ctl} --socket {socket} approve asks > sneaky.out 2>&1; echo $? > sneaky.rc"]
cwd = "."
side_effect = "read"
"""


# A program on n1 whose spec grants it `activate`: sessionctl inside a run talks
# to its node's program endpoint, which carries the request to the owner.
WAKER = """name = "waker"
[run]
exec = ["sh", "-c", "{ctl} activate plain > waker.out 2>&1; echo $? > waker.rc"]
cwd = "."
side_effect = "read"
grants = ["activate"]
"""


def terminated(r: dict[str, Any]) -> bool:
    return bool(r["data"]["to"] == "terminated")


def test_ps_on_any_node_lists_every_session_with_its_node(three: list[Daemon]) -> None:
    n1, n2, n3 = three
    n1.ctl("create", str(n1.write_spec("hello", HELLO)), check=True)
    n2.ctl("create", str(n2.write_spec("plain", PLAIN)), check=True)
    for d in three:
        rows = {r["name"]: r for r in d.json("ps")}
        assert set(rows) == {"hello", "plain"}, rows
        assert rows["hello"]["node"] == "n1"
        assert rows["plain"]["node"] == "n2"
        assert rows["hello"]["state"] == "sleeping"  # its owner's own row, not a guess
        assert rows["plain"]["state"] == "created"
    table = n3.ctl("ps", check=True).stdout
    assert "NODE" in table
    assert "n1" in table
    assert "n2" in table


def test_read_only_syscalls_on_another_nodes_session_are_answered(
    three: list[Daemon], pg_dsn: str
) -> None:
    n1, n2, _ = three
    n1.ctl("create", str(n1.write_spec("hello", HELLO)), check=True)
    shown = n2.json("show", "hello")
    assert shown["name"] == "hello"
    assert shown["state"] == "sleeping"
    records = n2.json("log", "hello")
    assert records[0]["type"] == "session.created"
    assert records[0]["node"] == "n1"
    assert n2.json("gate", "hello")["ok"] in (True, False)
    assert 'name = "hello"' in n2.ctl("cat", "hello", check=True).stdout
    assert n2.json("replay", "hello", "--view", "state")["name"] == "hello"

    def left() -> bool:  # an answered request's row is dropped: the table stays small
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM requests").fetchone()
        return row is not None and row[0] == 0

    wait_for(left, what="the answered requests' rows to go")


def test_approve_on_one_node_of_a_session_blocked_on_another_runs_it_once(
    three: list[Daemon],
) -> None:
    n1, n2, n3 = three
    n2.ctl("create", str(n2.write_spec("asks", ASKS)), check=True)
    n1.ctl("activate", "asks", check=True)  # carried to n2, which runs it
    wait_event(n2, "asks", "approval.requested")
    assert n3.json("show", "asks")["state"] == "blocked"
    n1.ctl("approve", "asks", "--by", "from n1", check=True)
    granted = wait_event(n2, "asks", "approval.granted")
    assert granted["node"] == "n2"  # carried out by its owner
    assert granted["data"]["uid"] == os.getuid()  # with the caller's identity
    assert granted["data"]["channel"] == "cli"
    assert granted["data"]["by"] == "from n1"
    wait_event(n2, "asks", "lifecycle.changed", match=terminated)
    again = n3.ctl("approve", "asks")  # the same refusal as on its own node
    assert again.returncode == 1, again.stderr
    assert "no pending approval" in again.stderr or "terminated" in again.stderr
    assert (n2.root / "asks.txt").read_text() == "ran\n"  # run exactly once
    grants = n2.json("log", "asks", "--type", "approval.granted")
    assert len(grants) == 1


def test_activate_through_another_node_runs_the_session_on_its_owner(three: list[Daemon]) -> None:
    n1, n2, _ = three
    n2.ctl("create", str(n2.write_spec("plain", PLAIN)), check=True)
    n1.ctl("activate", "plain", check=True)
    done = wait_event(n2, "plain", "lifecycle.changed", match=terminated)
    assert done["node"] == "n2"
    assert (n2.root / "plain.txt").read_text() == "ran\n"
    refused = n1.ctl("activate", "plain")  # an illegal transition, refused by its owner
    assert refused.returncode == 1
    assert "terminated" in refused.stderr


def test_a_programs_activate_reaches_a_session_on_another_node(three: list[Daemon]) -> None:
    n1, n2, _ = three
    n2.ctl("create", str(n2.write_spec("plain", PLAIN)), check=True)
    n1.ctl("create", str(n1.write_spec("waker", WAKER.format(ctl=SESSIONCTL))), check=True)
    n1.ctl("activate", "waker", check=True)
    done = wait_event(n2, "plain", "lifecycle.changed", match=terminated)
    assert done["node"] == "n2"
    assert (n2.root / "plain.txt").read_text() == "ran\n"
    assert wait_for(lambda: _read(n1.root / "waker.rc"), what="the program's exit") == "0"


def test_a_programs_send_reaches_a_session_on_another_node(three: list[Daemon]) -> None:
    n1, n2, _ = three
    n2.ctl("create", str(n2.write_spec("hello", HELLO)), check=True)
    (n1.root / "sender.py").write_text(SENDER_PROGRAM)
    spec = SENDER.format(python=sys.executable)
    n1.ctl("create", str(n1.write_spec("sender", spec)), check=True)
    n1.ctl("activate", "sender", check=True)
    received = wait_event(n2, "hello", "message.received")
    assert received["data"]["text"] == "from a program on n1"
    assert received["data"]["sender"] == "sender"
    wait_event(n2, "hello", "run.finished")  # its message trigger woke it on n2
    steps = n1.json("log", "sender", "--type", "tool.finished")
    assert [s["data"]["status"] for s in steps] == ["ok"]


# n2 and n3 drain and the test waits for their renewals, and the refused request
# waits on them too: with the long lease it took 75 s instead of 11
@pytest.mark.short_lease("n2", "n3")
def test_a_request_for_a_session_whose_node_is_down_fails_clearly(
    three: list[Daemon], pg_dsn: str
) -> None:
    n1, n2, n3 = three
    n1.ctl("create", str(n1.write_spec("plain", PLAIN)), check=True)
    missing = n2.ctl("activate", "nobody")
    assert missing.returncode == 4  # no such session anywhere: as on one machine
    # n2 and n3 drain: they take nothing over, so n1's session waits for n1
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for name in ("n2", "n3"):
            n2.ctl("drain", name, check=True)
        row = conn.execute("SELECT now()").fetchone()  # after both drains committed
        assert row is not None

        def told() -> bool:  # each has renewed since, so it knows it is draining
            got = conn.execute(
                "SELECT count(*) FROM nodes WHERE name IN ('n2', 'n3') AND renewed_at > %s",
                (row[0],),
            ).fetchone()
            return got is not None and got[0] == 2

        wait_for(told, what="n2 and n3 renewing their leases as draining")
        n1.kill9()
        conn.execute("UPDATE nodes SET lease_until = now() WHERE name = 'n1'")  # lapsed now
    rows = {r["name"]: r for r in n3.json("ps")}
    assert rows["plain"]["node"] == "n1"
    assert rows["plain"]["state"] == "waiting"
    down = n2.ctl("activate", "plain", timeout=120)
    assert down.returncode == 3, down.stderr
    assert "n1" in down.stderr
    assert "nothing was done" in down.stderr
    assert not (n1.root / "plain.txt").exists()


# The control socket's own refusal of a run's process, the layer beneath the
# sandbox: a sandboxed run cannot reach any node's control socket at all
# (tests/e2e/test_sandbox.py), so here the operator has turned it off.
UNCONFINED = SHARED + '[run]\nsandbox = "off"\n'


def test_a_runs_process_is_refused_on_a_node_that_does_not_own_its_session(
    pg_dsn: str,
) -> None:
    with nodes_of(pg_dsn, 2, extra=UNCONFINED) as (n1, n2):
        _refused_on_another_node(n1, n2)


def _refused_on_another_node(n1: Daemon, n2: Daemon) -> None:
    n2.ctl("create", str(n2.write_spec("asks", ASKS)), check=True)
    n2.ctl("activate", "asks", check=True)
    wait_event(n2, "asks", "approval.requested")
    spec = SNEAKY.format(ctl=SESSIONCTL, socket=n2.socket)
    n1.ctl("create", str(n1.write_spec("sneaky", spec)), check=True)
    n1.ctl("activate", "sneaky", check=True)
    wait_event(n1, "sneaky", "lifecycle.changed", match=terminated)
    rc = wait_for(lambda: _read(n1.root / "sneaky.rc"), what="the program's exit code")
    assert rc != "0", _read(n1.root / "sneaky.out")
    assert "ping" in (_read(n1.root / "sneaky.out") or "")  # a run's process may only ping
    # and through n1's socket too, where forwarding would have carried it to n2
    spec = SNEAKY.format(ctl=SESSIONCTL, socket=n1.socket).replace("sneaky", "sneaky1")
    n1.ctl("create", str(n1.write_spec("sneaky1", spec)), check=True)
    n1.ctl("activate", "sneaky1", check=True)
    wait_event(n1, "sneaky1", "lifecycle.changed", match=terminated)
    assert wait_for(lambda: _read(n1.root / "sneaky1.rc"), what="exit code") != "0"
    assert n2.json("show", "asks")["state"] == "blocked"  # still waiting for a person
    assert n2.json("log", "asks", "--type", "approval.granted") == []
    n1.ctl("approve", "asks", check=True)  # a person, through n1: carried to n2
    wait_event(n2, "asks", "lifecycle.changed", match=terminated)
    assert len(n2.json("log", "asks", "--type", "approval.granted")) == 1


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


@pytest.mark.short_lease("n2")
def test_an_approve_left_for_a_paused_owner_is_carried_out_once_by_its_new_owner(
    three: list[Daemon],
) -> None:
    n1, n2, n3 = three
    n2.ctl("create", str(n2.write_spec("asks", ASKS)), check=True)
    n2.ctl("activate", "asks", check=True)
    wait_event(n2, "asks", "approval.requested")
    assert n2.proc is not None
    os.kill(n2.proc.pid, signal.SIGSTOP)  # n2 owns it, and answers nothing now
    try:
        # left for n2; n2's lease lapses, n1 or n3 takes the session over and
        # carries the request out there
        n1.ctl("approve", "asks", "--by", "while n2 slept", check=True, timeout=120)
        new = wait_for(lambda: taken_over([n1, n3], "asks"), what="a take-over")
        granted = wait_event(new, "asks", "approval.granted")
        assert granted["node"] == node_name(new)
        assert granted["data"]["uid"] == os.getuid()
        wait_event(new, "asks", "lifecycle.changed", match=terminated)
        assert len(new.json("log", "asks", "--type", "approval.granted")) == 1
    finally:
        os.kill(n2.proc.pid, signal.SIGCONT)
    assert n2.stop(signal.SIGCONT, timeout=60) == LEASE_LOST_EXIT  # its lease was gone
    assert (n2.root / "asks.txt").read_text() == "ran\n"  # run once, by the new owner
