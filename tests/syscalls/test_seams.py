"""The cluster's seams (sessiond.syscalls.seams), in process: the kernel built on
a files store with stand-ins for what a cluster node gives it. What each
syscall does on a node is read in its family, and the dispatch's tables call
the methods the kernel was built with. (The real nodes: tests/cluster/.)"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from sessiond.config import load_config
from sessiond.errors import NoSuchSession, Refused
from sessiond.ipc.dispatch import method_table
from sessiond.ipc.params import NameParams, SendParams
from sessiond.log.store.files import FileStore
from sessiond.replies import Draining, NodeMove, NodeRow, PsRow, Sent, WaitingSession
from sessiond.syscalls.kernel import Kernel
from sessiond.syscalls.seams import Seams
from sessiond.table.sessions import Table
from tests.helpers import arun


class Elsewhere:
    """A cluster as one node sees it: 'far' waits for node n2, 'there' runs on n2."""

    def __init__(self) -> None:
        self.placed: list[str] = []
        self.posted: list[tuple[str, str, str]] = []

    async def waiting(self) -> list[PsRow]:
        return [cast(PsRow, {"name": "far", "state": "waiting", "node": "n2"})]

    async def show_waiting(self, name: str) -> WaitingSession | None:
        return cast(WaitingSession, {"name": name, "state": "waiting"}) if name == "far" else None

    async def place(self, name: str) -> str | None:
        self.placed.append(name)
        return "n2"

    async def nodes(self) -> list[NodeRow]:
        return [cast(NodeRow, {"name": "n1"}), cast(NodeRow, {"name": "n2"})]

    async def migrate_node(
        self,
        name: str,
        to: str,
        profile: str | None = None,
        socket: str | None = None,
        *,
        force: bool = False,
    ) -> NodeMove:
        return {"session": name, "node": to}

    async def drain(self, name: str) -> Draining:
        return {"node": name, "state": "draining", "sessions": 0, "staying": 0}

    async def post(self, to: str, text: str, sender: str) -> Sent | None:
        if to != "there":
            return None
        self.posted.append((to, text, sender))
        return {"session": to, "seq": None, "woke": None, "node": "n2"}

    async def exists(self, name: str) -> bool:
        return name == "there"


def kernel(tmp_path: Path, seams: Seams) -> Kernel:
    config = load_config(None, env={}, state_dir=tmp_path, socket=tmp_path / "s.sock")
    return Kernel(config, Table(config, FileStore(tmp_path)), {}, seams)


SPEC = 'name = "{name}"\n'


def test_a_node_lists_shows_and_places_through_its_placement(tmp_path: Path) -> None:
    cluster = Elsewhere()
    k = kernel(tmp_path, Seams(placement=cluster, nodes=cluster, mail=cluster))

    async def go() -> None:
        made = await k.control.create(SPEC.format(name="here"), str(tmp_path))
        assert made["handed_to"] == "n2"  # it may not run here: handed on
        assert cluster.placed == ["here"]
        assert [r["name"] for r in await k.inspection.ps()] == ["far", "here"]
        assert (await k.inspection.show("far"))["state"] == "waiting"
        with pytest.raises(NoSuchSession):
            await k.inspection.show("nowhere")

    arun(go())


def test_one_machine_has_no_seams_and_refuses_the_node_syscalls(tmp_path: Path) -> None:
    k = kernel(tmp_path, Seams())

    async def go() -> None:
        made = await k.control.create(SPEC.format(name="here"), str(tmp_path))
        assert "handed_to" not in made
        assert [r["name"] for r in await k.inspection.ps()] == ["here"]
        for call in (k.nodes(), k.drain("n2"), k.migrate_node("here", "n2")):
            with pytest.raises(Refused, match="not a cluster node"):
                await call
        with pytest.raises(NoSuchSession):
            await k.lineage.send("there", "hi")

    arun(go())


def test_the_dispatch_calls_what_the_kernel_was_built_with(tmp_path: Path) -> None:
    """The syscalls a node changes reach its seams through the method table, and a
    message for a session another node runs is left for it."""
    cluster = Elsewhere()
    k = kernel(tmp_path, Seams(placement=cluster, nodes=cluster, mail=cluster))
    methods = method_table(k, reload=lambda: None)  # type: ignore[arg-type, return-value]

    async def go() -> None:
        _, drain = methods["drain"]
        assert await drain(NameParams(name="n2")) == {
            "node": "n2",
            "state": "draining",
            "sessions": 0,
            "staying": 0,
        }
        _, nodes = methods["nodes"]
        assert [n["name"] for n in await nodes(None)] == ["n1", "n2"]
        _, send = methods["send"]
        sent = await send(SendParams(to="there", text="hi", sender="ann"))
        assert sent["node"] == "n2"
        assert cluster.posted == [("there", "hi", "ann")]
        elsewhere = k.sdk.sends.elsewhere  # a program's run.send asks the same seam
        assert elsewhere is not None
        assert await elsewhere("there")

    arun(go())
