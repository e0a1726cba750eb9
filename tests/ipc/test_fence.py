"""The socket folder check and the ACL encoding (the e2e side is in
tests/e2e/test_daemon.py, with a real second uid)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sessiond.ipc import fence


def test_an_acl_names_each_user_and_group_under_a_mask_and_keeps_the_mode_bits() -> None:
    blob = fence.encode_acl(0o600, {1001: fence.READ | fence.WRITE}, {50: fence.READ})
    entries = fence.decode_acl(blob)
    assert entries == [
        (fence.USER_OBJ, 6, 0xFFFFFFFF),
        (fence.USER, 6, 1001),
        (fence.GROUP_OBJ, 0, 0xFFFFFFFF),
        (fence.GROUP, 4, 50),
        (fence.MASK, 6, 0xFFFFFFFF),
        (fence.OTHER, 0, 0xFFFFFFFF),
    ]


def test_an_acl_without_named_entries_has_no_mask() -> None:
    tags = [tag for tag, _, _ in fence.decode_acl(fence.encode_acl(0o700, {}, {}))]
    assert tags == [fence.USER_OBJ, fence.GROUP_OBJ, fence.OTHER]


def test_the_kernel_takes_the_acl_and_mode_bits_stay_owner_only(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("")
    os.chmod(target, 0o600)
    try:
        fence.grant(target, fence.READ | fence.WRITE, {65534}, set())
    except fence.FenceError as exc:
        pytest.skip(f"this file system has no ACLs: {exc}")
    stored = fence.decode_acl(os.getxattr(target, fence.XATTR))
    assert (fence.USER, 6, 65534) in stored
    assert os.stat(target).st_mode & 0o007 == 0


def test_a_folder_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(fence.FenceError, match="not a folder"):
        fence.check_folder(tmp_path / "link")


def test_a_private_folder_is_accepted_and_tightened(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o755)
    fence.check_folder(folder)
    assert os.stat(folder).st_mode & 0o777 == 0o700


def test_a_folder_others_may_write_is_refused_naming_its_mode(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    with pytest.raises(fence.FenceError, match=r"writable by others \(mode 1777\)"):
        fence.check_folder(folder)
