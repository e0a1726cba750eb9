"""A workspace on a file system without POSIX ACLs (the fault file system, FUSE):
a root daemon cannot give a session's uid an ACL there, so the workspace is the
run's only if its mode bits already let the uid write it; else the start is
refused, naming the file system and the ways on. The campaign's workspace lies
on this file system, with its runs confined (tests/faults/campaign.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from sessiond.runs.uids import UidError, open_to
from tests.e2e.harness import short_dir
from tests.faults.faultfs import Mount, mounted, usable

UID = 458811  # no account's: a session's dynamic uid

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="another uid's access: root"),
    pytest.mark.skipif(usable() is not None, reason=f"no FUSE here: {usable()}"),
]


def as_uid(*argv: str) -> subprocess.CompletedProcess[bytes]:
    drop = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups"]
    return subprocess.run([*drop, *argv], capture_output=True, check=False)


@pytest.fixture
def mount() -> Iterator[Mount]:
    root = short_dir()
    os.chmod(root, 0o711)  # the uid may reach the mount, no more
    try:
        with mounted(root / "fs") as m:
            yield m
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_folder_not_writable_by_the_uid_is_refused_naming_the_file_system_and_the_ways(
    mount: Mount,
) -> None:
    ws = mount.path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o755)
    (ws / "f").write_text("x")
    with pytest.raises(UidError) as caught:
        open_to(ws, UID, never=set(), only_inside=set())
    text = str(caught.value)
    assert f"{ws} is on a file system without POSIX ACLs (fuse" in text
    for way in ("ext4", "chmod 1777", "[run] user", '[run] sandbox = "off"'):
        assert way in text, way


def test_a_folder_writable_by_all_is_the_uids_to_write_as_it_stands(mount: Mount) -> None:
    ws = mount.path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o777)
    open_to(ws, UID, never=set(), only_inside=set())  # nothing to add, nothing refused
    # and the uid can indeed write there: the mount lets other uids in
    done = as_uid("sh", "-c", f"echo work > {ws}/out")
    assert done.returncode == 0, done.stderr
    assert (ws / "out").read_text() == "work\n"
