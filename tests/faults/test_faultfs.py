"""The fault file system keeps exactly what POSIX promises across a power cut, no
more and no less (its own bugs must not hide the daemon's): property tests of
the model (tests/faults/faultmodel.py) against the rules, and of the FUSE mount
(tests/faults/faultfs.py) against the model."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.faultfs import mounted, usable
from tests.faults.faultmodel import Model

NAMES = ["/a", "/b", "/d/a", "/d/b"]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from(NAMES)),
        st.tuples(st.just("append"), st.sampled_from(NAMES), st.binary(min_size=1, max_size=9)),
        st.tuples(st.just("fsync"), st.sampled_from(NAMES)),
        st.tuples(st.just("fsyncdir"), st.sampled_from(["/", "/d"])),
        st.tuples(st.just("unlink"), st.sampled_from(NAMES)),
        st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    ),
    max_size=30,
)


def apply(m: Model, op: tuple[object, ...]) -> None:
    """One operation on the model; an error (no such file...) leaves it unchanged."""
    kind, path = op[0], str(op[1])
    try:
        if kind == "create":
            m.make(path, 0o100644)
        elif kind == "append":
            node = m.lookup(path)
            m.write(node, len(node.data), cast(bytes, op[2]))
        elif kind in ("fsync", "fsyncdir"):
            m.fsync(m.lookup(path))
        elif kind == "unlink":
            m.unlink(path)
        elif kind == "rename":
            m.rename(path, str(op[2]))
    except OSError:
        pass


def files(m: Model) -> dict[str, bytes]:
    out = {}
    for path in NAMES:
        try:
            out[path] = bytes(m.lookup(path).data)
        except OSError:
            continue
    return out


@settings(max_examples=400, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**32))
def test_a_cut_keeps_what_was_fsynced_and_only_what_was_ever_there(
    ops: list[tuple[object, ...]], seed: int
) -> None:
    m = Model()
    m.make("/d", 0o40755)
    m.fsync(m.lookup("/"))
    seen: dict[str, set[bytes]] = {p: set() for p in NAMES}  # every content a name held
    touched: set[str] = set()  # names whose entry changed since their folder's fsync
    dirty: set[int] = set()  # inodes written since their fsync
    for op in ops:
        apply(m, op)
        kind, path = op[0], str(op[1])
        if kind == "fsyncdir":
            touched = {p for p in touched if p.rpartition("/")[0] != path.rstrip("/")}
        elif kind in ("create", "unlink"):
            touched.add(path)
        elif kind == "rename":
            touched |= {path, str(op[2])}
        for p, data in files(m).items():
            seen[p].add(data)
        for p in NAMES:
            try:
                node = m.lookup(p)
            except OSError:
                continue
            if kind == "append" and path == p:
                dirty.add(node.ino)
            if kind == "fsync" and path == p:
                dirty.discard(node.ino)
    before = {p: (m.lookup(p).ino, bytes(m.lookup(p).data)) for p in files(m)}
    durable = {p: bytes(m.lookup(p).durable) for p in files(m)}
    m.cut(random.Random(seed))
    after = files(m)
    for p, data in after.items():
        # nothing appears that was never there; a file keeps its synced bytes and
        # at most a prefix of what came after
        assert any(data.startswith(old) or old.startswith(data) for old in seen[p] | {b""}), p
    for p, (ino, data) in before.items():
        if p not in touched:  # its entry is durable: it is there
            assert p in after, (p, ops)
            if ino not in dirty:
                assert after[p] == data
            else:
                assert after[p].startswith(durable[p])
                assert data.startswith(after[p])
    for p in NAMES:
        if p not in before and p not in touched:
            assert p not in after


def test_a_torn_append_keeps_a_prefix_of_the_unsynced_bytes() -> None:
    kept = set()
    for seed in range(50):
        m = Model()
        node = m.make("/f", 0o100644)
        m.fsync(m.lookup("/"))
        m.write(node, 0, b"synced\n")
        m.fsync(node)
        m.write(node, 7, b"0123456789")
        m.cut(random.Random(seed))
        data = bytes(m.lookup("/f").data)
        assert data.startswith(b"synced\n")
        assert b"synced\n0123456789".startswith(data)
        kept.add(len(data))
    assert len(kept) > 3  # torn at many places, not all or nothing


@pytest.mark.skipif(usable() is not None, reason=f"no FUSE here: {usable()}")
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS, seed=st.integers(0, 2**32))
def test_the_mount_holds_what_the_model_holds_before_and_after_a_cut(
    ops: list[tuple[object, ...]], seed: int
) -> None:
    root = Path(tempfile.mkdtemp(prefix="sd-fs-"))
    try:
        with mounted(root / "m") as mount:
            mnt = str(root / "m")
            m = Model()
            m.make("/d", 0o40755)
            os.mkdir(mnt + "/d")
            for path in ("/", "/d"):
                m.fsync(m.lookup(path))
                fd = os.open(mnt + path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            for op in ops:
                apply(m, op)
                _on_mount(mnt, op)
            assert _read(mnt) == files(m)
            mount.cut(seed)
            m.cut(random.Random(seed))
            assert _read(mnt) == files(m)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _on_mount(mnt: str, op: tuple[object, ...]) -> None:
    kind, path = op[0], mnt + str(op[1])
    try:
        if kind == "create":
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        elif kind == "append":
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.write(fd, cast(bytes, op[2]))
            os.close(fd)
        elif kind in ("fsync", "fsyncdir"):
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        elif kind == "unlink":
            os.unlink(path)
        elif kind == "rename":
            os.rename(path, mnt + str(op[2]))
    except OSError:
        pass


def _read(mnt: str) -> dict[str, bytes]:
    out = {}
    for path in NAMES:
        try:
            out[path] = Path(mnt + path).read_bytes()
        except OSError:
            continue
    return out
