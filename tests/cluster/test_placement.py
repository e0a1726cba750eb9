"""Placement on three real nodes (docs/design.md section 10): workspaces belong to
machines, a spec can pin a node or need labels a node advertises, and claims,
failover, ``migrate --node`` and ``drain`` keep to it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import HELLO, TTL, lease, node_name, short_leased, taken_over
from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for

LABELS = {1: "{}", 2: '{ zone = "eu" }', 3: '{ zone = "eu", gpu = "a100" }'}


@pytest.fixture
def shared() -> Iterator[Path]:
    folder = short_dir()  # what every node mounts at the same path
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def placed(pg_dsn: str, shared: Path, request: pytest.FixtureRequest) -> Iterator[list[Daemon]]:
    short = short_leased(request)
    nodes: list[Daemon] = []
    try:
        for i in (1, 2, 3):
            config = (
                f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n{i}"\n{lease(f"n{i}" in short)}'
                f'shared_paths = ["{shared}"]\nlabels = {LABELS[i]}\nmoves_per_interval = 0\n'
            )
            nodes.append(Daemon(short_dir(), config).start())
        yield nodes
    finally:
        for d in nodes:
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)


def spec_in(folder: Path, name: str, extra: str = "") -> Path:
    """HELLO named ``name``, its workspace ``folder``; ``extra`` keys at the top."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(extra + HELLO.replace('name = "hello"', f'name = "{name}"'))
    return path


def row(d: Daemon, name: str) -> dict[str, Any] | None:
    return next((r for r in d.json("ps") if r["name"] == name), None)


def runs_on(d: Daemon, name: str) -> bool:
    """``d`` runs ``name`` (its ``ps`` lists the whole cluster's: the row's node says)."""
    r = row(d, name)
    return r is not None and r["state"] != "waiting" and r.get("node") == node_name(d)


@pytest.mark.short_lease("n1")
def test_sessions_that_belong_to_a_node_wait_for_it_and_a_shared_one_fails_over(
    placed: list[Daemon], shared: Path
) -> None:
    n1, n2, n3 = placed
    specs = {
        "local": spec_in(n1.root / "work", "local"),  # its workspace is n1's own disk
        "pinned": spec_in(shared / "p", "pinned", 'node = "n1"\n'),
        "shared": spec_in(shared / "s", "shared"),
    }
    for spec in specs.values():
        n1.ctl("create", str(spec), check=True)
    assert [r["name"] for r in n1.json("ps")] == ["local", "pinned", "shared"]

    n1.kill9()
    wait_for(lambda: taken_over([n2, n3], "shared"), timeout=TTL + 30, what="shared to move")
    assert taken_over([n2, n3], "local") is None
    assert taken_over([n2, n3], "pinned") is None
    rows = {r["name"]: r for r in n2.json("ps")}
    assert rows["local"]["state"] == "waiting"
    assert rows["local"]["node"] == "n1"
    assert rows["local"]["reason"] == (
        f"waiting for node n1 (its workspace {(n1.root / 'work').resolve()} lives there)"
    )
    assert rows["pinned"]["state"] == "waiting"
    assert rows["pinned"]["reason"] == "waiting for node n1 (its spec pins it there)"
    shown = n3.json("show", "pinned")
    assert (shown["state"], shown["node"]) == ("waiting", "n1")
    assert "waiting for node n1" in n3.ctl("show", "local", check=True).stdout

    n1.start()  # its node is back: it claims them again, and they run there
    wait_for(lambda: runs_on(n1, "local") and runs_on(n1, "pinned"), timeout=30, what="n1")
    n2.ctl("send", "pinned", "you are home", check=True)
    assert wait_event(n1, "pinned", "run.finished")["node"] == "n1"
    assert not runs_on(n1, "shared")  # the one that moved stays where it went


@pytest.mark.short_lease("n3")
def test_labels_and_pins_are_kept_by_create_migrate_drain_and_failover(
    placed: list[Daemon], shared: Path
) -> None:
    n1, n2, n3 = placed
    train = spec_in(shared / "t", "train", 'node_labels = { gpu = "a100" }\n')
    created = n1.json("create", str(train))  # n1 lacks gpu: it goes to the node that has it
    assert created["handed_to"] == "n3"
    wait_for(lambda: runs_on(n3, "train"), timeout=30, what="train on n3")
    refused = n3.ctl("migrate", "train", "--node", "n2")
    assert refused.returncode != 0
    assert "node 'n2' lacks the labels it needs: gpu=a100 (it has zone=eu)" in refused.stderr
    assert runs_on(n3, "train")  # kept where it was
    assert (
        "lacks the labels it needs: gpu=a100" in n3.ctl("migrate", "train", "--node", "n1").stderr
    )

    done = n1.ctl("create", str(spec_in(shared / "e", "eu", 'node = "n2"\n')), check=True)
    assert "handed to node n2" in done.stdout
    wait_for(lambda: runs_on(n2, "eu"), timeout=30, what="eu on its node n2")
    refused = n2.ctl("migrate", "eu", "--node", "n3")
    assert "it is pinned to node 'n2'" in refused.stderr

    n1.ctl("create", str(spec_in(shared / "f", "free")), check=True)
    n1.ctl("migrate", "free", "--node", "n3", check=True)
    wait_for(lambda: runs_on(n3, "free"), timeout=30, what="free on n3")
    n3.kill9()  # free moves; train, which needs gpu, waits for a node that has it
    wait_for(lambda: taken_over([n1, n2], "free"), timeout=TTL + 30, what="free to move")
    assert taken_over([n1, n2], "train") is None
    waiting = row(n1, "train")
    assert waiting is not None
    assert (waiting["state"], waiting["reason"]) == (
        "waiting",
        "waiting for a node with labels gpu=a100",
    )

    # made while no node has gpu: let go at once, it waits for one
    n1.ctl(
        "create",
        str(spec_in(shared / "t2", "train2", 'node_labels = { gpu = "a100" }\n')),
        check=True,
    )
    assert (row(n2, "train2") or {}).get("state") == "waiting"

    drained = n1.json("drain", "n2")  # eu is pinned to n2: it stays
    assert drained["staying"] == 1
    wait_for(lambda: not runs_on(n2, "free"), timeout=30, what="free off n2")
    assert runs_on(n2, "eu")
    assert "1 stay (pinned to it" in n1.ctl("drain", "n2", check=True).stdout

    n3.start()  # the node with gpu is back: it claims both
    wait_for(lambda: runs_on(n3, "train") and runs_on(n3, "train2"), timeout=30, what="n3")


@pytest.mark.short_lease("n1")
def test_an_operator_rehomes_a_session_whose_node_is_gone_and_only_then(
    placed: list[Daemon], shared: Path
) -> None:
    n1, n2, n3 = placed
    n1.ctl("create", str(spec_in(n1.root / "work", "local")), check=True)
    n1.ctl("create", str(spec_in(shared / "p", "pinned", 'node = "n1"\n')), check=True)
    up = n2.ctl("migrate", "local", "--node", "n2", "--force")
    assert up.returncode == 1, up
    assert "runs on node 'n1', which is up: --force is for a session whose node is down" in (
        up.stderr
    )
    assert runs_on(n1, "local")  # nothing moved

    n1.kill9()
    wait_for(lambda: (row(n2, "local") or {}).get("state") == "waiting", timeout=TTL + 30)
    plain = n2.ctl("migrate", "local", "--node", "n3")  # at once, not after a wait
    assert plain.returncode == 1, plain
    assert "its node n1 is down" in plain.stderr
    assert "`sessionctl migrate local --node n3 --force`" in plain.stderr
    pinned = n2.ctl("migrate", "pinned", "--node", "n3", "--force")
    assert pinned.returncode == 1, pinned
    assert "pinned to node 'n1'" in pinned.stderr  # the spec's word holds
    nowhere = n2.ctl("migrate", "local", "--node", "n9", "--force")
    assert nowhere.returncode == 1, nowhere
    assert "node 'n9' is not a live node" in nowhere.stderr

    # its workspace is on n3 now (these nodes share a disk: it is already there)
    done = n2.ctl("migrate", "local", "--node", "n3", "--force", check=True)
    assert "re-homed local from node n1 to node n3" in done.stdout
    wait_for(lambda: taken_over([n3], "local"), timeout=30, what="n3 to take it over")
    n2.ctl("send", "local", "you live here now", check=True)
    finished = wait_event(n3, "local", "run.finished")
    assert finished["node"] == "n3"
    assert (row(n2, "local") or {}).get("node") == "n3"

    n1.start()  # the old node is back: it claims what is still its own, not this one
    wait_for(lambda: runs_on(n1, "pinned"), timeout=30, what="n1 to claim its pinned session")
    assert runs_on(n3, "local")
    assert taken_over([n1], "local") is None
