"""The fleet bench's supervision (sessiond/bench/fleet_nodes.py): a kill -9 it
does itself is never counted as a node's end by itself, nor the killed node
started again. Under load test_fleet reported ``ended_by_itself {'f1': [-9]}``:
the sampler had seen the node supervised just before kill9 cleared it, then saw
it ended, by the kill."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sessiond.bench.fleet_nodes import FleetNode


class Proc:
    """A node's process: ended once kill9's SIGKILL reached it."""

    pid = 4242

    def __init__(self) -> None:
        self.killed = False
        self.during_poll: threading.Thread | None = None

    def poll(self) -> int | None:
        if self.during_poll is not None:  # the kill9 comes while the sampler looks
            killer, self.during_poll = self.during_poll, None
            killer.start()
            killer.join(0.5)  # (blocked, where it waits for the sampler)
        return -9 if self.killed else None

    @property
    def returncode(self) -> int | None:
        return -9 if self.killed else None

    def wait(self, timeout: float | None = None) -> int:
        return -9


def test_a_kill9_while_the_sampler_looks_is_not_an_end_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = FleetNode(tmp_path / "f1", "postgresql:///x", "f1", 10.0, tmp_path)
    proc = Proc()
    launched: list[int] = []

    def kill(pid: int, sig: int) -> None:
        proc.killed = True

    monkeypatch.setattr(os, "kill", kill)  # kill9's SIGKILL reaches the fake only
    monkeypatch.setattr(node, "launch", lambda: launched.append(1))
    node.proc = proc  # type: ignore[assignment]
    node.supervised = True
    killer = threading.Thread(target=node.kill9)
    proc.during_poll = killer
    node.revive()
    killer.join(10)
    assert not killer.is_alive()
    assert proc.killed
    assert node.ended == []
    assert launched == []
    node.revive()  # once killed, still nothing: it is no longer supervised
    assert node.ended == []
    assert launched == []
