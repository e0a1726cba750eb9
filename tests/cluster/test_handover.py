"""`migrate --node` and `drain` on three real nodes (docs/design.md section 10)."""

from __future__ import annotations

from tests.cluster.conftest import HELLO, owned, taken_over
from tests.e2e.harness import Daemon, wait_event, wait_for


def owner_of(nodes: list[Daemon], session: str) -> Daemon:
    def find() -> Daemon | None:
        for d in nodes:
            if session in owned(d):
                return d
        return None

    return wait_for(find, timeout=30, what=f"the node that has {session}")  # type: ignore[no-any-return]


def test_migrate_node_hands_a_sleeping_session_over_and_it_runs_there(
    three: list[Daemon],
) -> None:
    n1, n2, n3 = three
    spec = n1.write_spec("hello", HELLO)
    n1.ctl("create", str(spec), check=True)
    done = n1.ctl("migrate", "hello", "--node", "n2", check=True)
    assert "handed hello over to node n2" in done.stdout
    wait_for(lambda: taken_over([n2], "hello"), timeout=30, what="n2 to take it")
    assert "hello" not in owned(n1)
    assert [r["node"] for r in n1.json("ps") if r["name"] == "hello"] == ["n2"]
    n3.ctl("send", "hello", "run on n2", check=True)
    finished = wait_event(n2, "hello", "run.finished")
    assert finished["node"] == "n2"
    epochs = [r["epoch"] for r in n2.json("log", "hello")]
    assert epochs == sorted(epochs)
    refused = n2.ctl("migrate", "hello", "--node", "nobody")
    assert refused.returncode == 1
    assert "not a live node" in refused.stderr
    assert "hello" in owned(n2)  # kept where it was


def test_drain_moves_every_session_off_a_node(three: list[Daemon]) -> None:
    n1, n2, n3 = three
    for name in ("a1", "a2", "a3"):
        spec = n1.write_spec(name, HELLO.replace('name = "hello"', f'name = "{name}"'))
        n1.ctl("create", str(spec), check=True)
    drained = n3.json("drain", "n1")  # through another node's socket
    assert (drained["node"], drained["state"], drained["sessions"]) == ("n1", "draining", 3)
    wait_for(lambda: not owned(n1), timeout=60, what="n1 to be empty")
    rows = {r["name"]: r for r in n3.json("nodes")}
    assert rows["n1"]["state"] == "draining"
    assert rows["n1"]["sessions"] == 0
    assert rows["n2"]["sessions"] + rows["n3"]["sessions"] == 3
    for name in ("a1", "a2", "a3"):
        owner = owner_of([n2, n3], name)
        n1.ctl("send", name, "still reachable", check=True)  # the drained node forwards
        wait_event(owner, name, "message.received")
