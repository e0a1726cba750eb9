"""The cgroups the cgroup tests may use: made for this test run by tests/cgroups.sh
(which .ci/run calls), named in SESSIOND_TEST_CGROUP2 and SESSIOND_TEST_PIDS_CGROUP.

Each test makes its own folder inside them and removes it, killing only what is
inside. Nothing else is touched. Without the folders the tests skip with the
reason, except under CI=true, where a skip would hide an untested path: they fail.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from sessiond.config import DaemonConfig, RunConfig
from sessiond.runs.cgroups import CgroupSupport, detect

CGROUP2_VAR = "SESSIOND_TEST_CGROUP2"
PIDS_VAR = "SESSIOND_TEST_PIDS_CGROUP"
HOW = "run the tests through tests/cgroups.sh (as root), as .ci/run does"


def need(what: str) -> NoReturn:
    """Skip, or under CI=true fail, a test that cannot run here."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and the cgroup tests cannot run: {what}; {HOW}", pytrace=False)
    pytest.skip(f"{what}; {HOW}")


def cgroup2_root() -> Path | None:
    value = os.environ.get(CGROUP2_VAR)
    return Path(value) if value else None


def pids_root() -> Path | None:
    value = os.environ.get(PIDS_VAR)
    return Path(value) if value else None


def roots() -> tuple[Path | None, Path | None]:
    """The test run's folders; needs at least the cgroup2 one (a machine without
    a v1 pids hierarchy sets SESSIOND_TEST_PIDS_CGROUP to "")."""
    if CGROUP2_VAR not in os.environ:
        need(f"{CGROUP2_VAR} is not set")
    return cgroup2_root(), pids_root()


def cgroup2_has_pids() -> bool:
    root = cgroup2_root()
    return root is not None and "pids" in (root / "cgroup.controllers").read_text().split()


# The layouts a daemon may have: cgroup2 alone (pids where it has them), the v1
# pids hierarchy alone, and cgroup2 for killing with v1 pids for the bound.
LAYOUTS = ["cgroup2", "v1", "cgroup2+v1"]


def layouts(*, bounding: bool) -> list[str]:
    """The layouts this machine offers (``bounding``: those with a pids controller).
    Collected at import: a layout the machine cannot have is not a test here."""
    v2, v1 = cgroup2_root(), pids_root()
    out = []
    if v2 is not None and (cgroup2_has_pids() or not bounding):
        out.append("cgroup2")
    if v1 is not None:
        out.append("v1")
    if v2 is not None and v1 is not None and not cgroup2_has_pids():
        out.append("cgroup2+v1")
    return out or ["none"]


@dataclass
class Folders:
    """One test's own folders inside the test run's cgroups."""

    cgroup2: Path | None
    pids: Path | None

    def config(self, layout: str) -> DaemonConfig:
        if layout == "none":
            need("this machine offers no cgroup layout with a pids controller")
        use2 = layout in ("cgroup2", "cgroup2+v1")
        use1 = layout in ("v1", "cgroup2+v1")
        if (use2 and self.cgroup2 is None) or (use1 and self.pids is None):
            need(f"layout {layout} needs folders this run did not make")
        return DaemonConfig(
            run=RunConfig(
                cgroup=str(self.cgroup2) if use2 else "off",
                pids_cgroup=self.pids if use1 else None,
            )
        )

    def support(self, layout: str) -> CgroupSupport:
        support = detect(self.config(layout))
        assert support is not None
        return support


def make_folders() -> Iterator[Folders]:
    v2, v1 = roots()
    name = f"t-{uuid.uuid4().hex[:12]}"
    made = []
    for root in (v2, v1):
        if root is not None:
            (root / name).mkdir()
            made.append(root / name)
    try:
        yield Folders(v2 / name if v2 else None, v1 / name if v1 else None)
    finally:
        for folder in made:
            empty_and_remove(folder)


def empty_and_remove(top: Path) -> None:
    """Kill what is inside ``top`` (and only that), then remove it, deepest first.
    Independent of sessiond.runs.cgroups, so a broken module cannot leave groups."""
    for folder, _, _ in os.walk(top, topdown=False):
        group = Path(folder)
        for _ in range(100):
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            if not pids:
                break
            fds = []
            for pid in pids:
                with contextlib.suppress(OSError):
                    fds.append(os.pidfd_open(pid))
            for fd in fds:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            for fd in fds:
                select.select([fd], [], [], 5)
                os.close(fd)
        group.rmdir()


# A holder, as the spawner's: it waits for one byte on stdin, then execs the
# program, so the test can put it in the group before the program runs.
HOLDER = "import os, sys; os.read(0, 1); os.execvp(sys.argv[1], sys.argv[1:])"


@contextlib.contextmanager
def held(*argv: str) -> Iterator[subprocess.Popen[bytes]]:
    """The program, held until ``release``; killed (if it still runs) and reaped at
    the end, its pipes closed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    with proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def release(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go")
    proc.stdin.flush()


def read_lines(proc: subprocess.Popen[bytes], count: int, timeout: float = 30.0) -> list[str]:
    """``count`` lines of the program's stdout, each wait bounded."""
    assert proc.stdout is not None
    out: list[str] = []
    buffer = b""
    fd = proc.stdout.fileno()
    while len(out) < count:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"the program wrote {out} and then nothing for {timeout}s"
        chunk = os.read(fd, 4096)
        assert chunk, f"the program closed its output after {out}"
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        out.extend(line.decode() for line in lines)
    return out


def exited(pid_fds: list[int], timeout: float = 10.0) -> bool:
    """Whether every pidfd says its process has exited (waiting up to ``timeout``)."""
    poller = select.poll()
    for fd in pid_fds:
        poller.register(fd, select.POLLIN)
    left = set(pid_fds)
    while left:
        events = poller.poll(timeout * 1000)
        if not events:
            return False
        for fd, _ in events:
            poller.unregister(fd)
            left.discard(fd)
    return True
