"""The jsonl:// target's file and lines (sessiond.notify.jsonl), without a daemon."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import orjson
import pytest

from sessiond.config import NotifyConfig
from sessiond.notify.cursor import Cursor
from sessiond.notify.jsonl import append, path_of
from sessiond.notify.notices import Notice
from sessiond.notify.target import Target, load_apprise

NOTICE = Notice(
    session="deploy", seq=7, event="approval.requested", type="approval.requested",
    ts="2026-01-01T00:00:00Z", title="sessiond: deploy needs approval: command",
    body="id: deploy:7", level="warning", link="http://127.0.0.1:8765/s/deploy",
    actions=(("approve", "http://a"), ("deny", "http://d")),
)  # fmt: skip


def test_a_relative_file_is_in_the_state_dir_an_absolute_one_is_itself(tmp_path: Path) -> None:
    assert path_of("jsonl://notices.jsonl", tmp_path) == tmp_path / "notices.jsonl"
    assert path_of("jsonl://notify/a.jsonl", tmp_path) == tmp_path / "notify" / "a.jsonl"
    assert path_of("jsonl:///var/log/n.jsonl", tmp_path) == Path("/var/log/n.jsonl")
    with pytest.raises(ValueError, match="name a file"):
        path_of("jsonl://", tmp_path)


def test_each_notice_is_one_json_line_with_the_webhook_fields(tmp_path: Path) -> None:
    target = Target(
        NotifyConfig(url="jsonl://out/n.jsonl"), Cursor(tmp_path / "c"), load_apprise(), tmp_path
    )
    assert target.file == tmp_path / "out" / "n.jsonl"
    assert target._send(NOTICE) is None
    append(tmp_path / "out" / "n.jsonl", NOTICE)
    lines = (tmp_path / "out" / "n.jsonl").read_bytes().splitlines()
    assert len(lines) == 2
    line = orjson.loads(lines[0])
    assert line["notice_id"] == "deploy:7"
    assert line["approve_url"] == "http://a"
    assert line["deny_url"] == "http://d"
    assert "approve: http://a" in line["message"]


def test_links_go_only_into_a_private_regular_file_of_the_daemons_user(tmp_path: Path) -> None:
    loose = tmp_path / "loose.jsonl"
    loose.touch(mode=0o644)
    loose.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        append(loose, NOTICE)
    assert loose.read_bytes() == b""  # no link written
    append(loose, dataclasses.replace(NOTICE, actions=()))  # a notice without links may
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo, 0o600)
    # ENXIO at once, not hung waiting for a reader
    with pytest.raises(OSError, match="No such device"):
        append(fifo, NOTICE)
    if os.geteuid() != 0:
        return  # (only root can give a file to another user; the rest is checked above)
    theirs = tmp_path / "theirs.jsonl"
    theirs.touch(mode=0o600)
    os.chown(theirs, 65534, 65534)  # made beforehand by another user, e.g. in /tmp
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        append(theirs, NOTICE)
    assert theirs.read_bytes() == b""
