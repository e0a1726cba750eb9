"""The link key and its tokens (sessiond.notify.links), without a daemon."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sessiond.notify.links import BadLink, Link, LinkKey, expiry

LINK = Link("payroll", "r1.command", "ab" * 16, 2_000_000_000, "approve", "phone")


def test_the_key_is_made_once_owner_only_and_tokens_are_deterministic(tmp_path: Path) -> None:
    first = LinkKey(tmp_path)
    token = first.token(LINK)
    path = tmp_path / "web" / "links.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = LinkKey(tmp_path)  # a restart reads the same key
    assert again.token(LINK) == token
    assert again.verify(token) == LINK
    assert first.url("https://ops.example/", LINK).startswith(
        "https://ops.example/approvals/payroll/r1.command?link="
    )


def test_a_loose_key_file_is_made_owner_only(tmp_path: Path) -> None:
    LinkKey(tmp_path).key()
    path = tmp_path / "web" / "links.key"
    path.chmod(0o644)
    LinkKey(tmp_path).key()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_another_key_or_a_changed_token_is_refused(tmp_path: Path) -> None:
    token = LinkKey(tmp_path / "a").token(LINK)
    with pytest.raises(BadLink, match="signature"):
        LinkKey(tmp_path / "b").verify(token)
    mine = LinkKey(tmp_path / "a")
    for bad in (token[:-2], "x" + token, token.replace(".", ""), "", "a.b"):
        with pytest.raises(BadLink):
            mine.verify(bad)


def test_the_deny_link_is_another_token_but_the_same_use() -> None:
    deny = Link(LINK.session, LINK.call, LINK.digest, LINK.expires, "deny", LINK.target)
    assert deny.use_id == LINK.use_id


def test_expiry_counts_from_the_request_record() -> None:
    assert expiry("2026-01-01T00:00:00.123456789Z", 3600) == 1767229200
