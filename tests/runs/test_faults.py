"""The fault points (sessiond/runs/faults.py): injected, never read on a
production path.

The crash and race tests stop a real daemon at named points through the
configuration's ``fault`` and ``fault_hold`` keys. Only the wiring reads them
(sessiond/daemon/faults.py): the runs floor and the syscalls call
``faults.point(...)`` on the object they were built with, ``NoFaults`` unless a
test asked."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import get_args

from sessiond.config import DaemonConfig
from sessiond.daemon.faults import ConfigFaults, faults, released
from sessiond.runs.faults import NO_FAULTS, NoFaults

ROOT = Path(__file__).resolve().parents[2] / "sessiond"
POINTS = get_args(get_args(DaemonConfig.model_fields["fault"].annotation)[0])
# where the fault keys may be read: their definition, and the wiring that builds Faults
READERS = {"config.py", "daemon/faults.py"}


def test_no_module_but_the_wiring_reads_the_fault_keys() -> None:
    readers = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if str(path.relative_to(ROOT)) not in READERS
        and re.search(r"\.fault(_hold(_until)?)?\b", path.read_text())
    )
    assert readers == [], f"test-only fault keys read on a production path: {readers}"


def test_production_stops_nowhere(tmp_path: Path) -> None:
    made = faults(DaemonConfig(state_dir=tmp_path, socket=tmp_path / "s.sock"))
    assert made is NO_FAULTS
    assert isinstance(made, NoFaults)
    assert POINTS  # the points the tests may name
    assert not any(made.armed(p) for p in POINTS)
    for p in POINTS:
        made.point(p)  # returns: nothing is killed
    asyncio.run(asyncio.wait_for(made.hold("before-spawn", "job"), 5))


def test_the_configured_points_are_armed_and_no_other(tmp_path: Path) -> None:
    release = tmp_path / "go"
    made = faults(
        DaemonConfig(
            state_dir=tmp_path,
            socket=tmp_path / "s.sock",
            fault="after-intent",
            fault_hold="before-spawn",
            fault_hold_until=release,
        )
    )
    assert isinstance(made, ConfigFaults)
    assert {p for p in POINTS if made.armed(p)} == {"after-intent"}
    assert made.armed("before-spawn")  # the hold point
    made.point("after-policy")  # not the configured point: returns


def test_a_hold_lets_go_when_its_file_appears(tmp_path: Path) -> None:
    release = tmp_path / "go"
    made = ConfigFaults(None, "before-spawn", release)

    async def main() -> list[str]:
        seen: list[str] = []
        held = asyncio.ensure_future(made.hold("before-spawn", "job"))
        other = asyncio.ensure_future(made.hold("after-spawn", "job"))
        await asyncio.wait_for(other, 5)  # another point: not held
        await asyncio.sleep(0)  # the hold is under way ...
        seen.append("held" if not held.done() else "went")
        release.touch()  # ... until the file exists
        await asyncio.wait_for(held, 30)
        seen.append("released")
        return seen

    assert asyncio.run(main()) == ["held", "released"]


def test_a_file_made_before_the_watch_began_releases_too(tmp_path: Path) -> None:
    release = tmp_path / "go"
    release.touch()
    asyncio.run(asyncio.wait_for(released(release), 30))
