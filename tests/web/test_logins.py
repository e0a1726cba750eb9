"""Logins: one per user, only a digest on disk, the newest replaces the old."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.errors import Refused
from sessiond.syscalls.logins import Logins, digest
from sessiond.webconfig import WebConfig


def test_a_login_is_kept_as_its_digest_and_replaced_by_the_next(tmp_path: Path) -> None:
    logins = Logins(tmp_path)
    ann = logins.mint("ann", 1000)
    bob = logins.mint("bob")
    on_disk = (tmp_path / "web" / "logins.json").read_text()
    assert ann not in on_disk
    assert digest(ann) in on_disk
    assert (tmp_path / "web" / "logins.json").stat().st_mode & 0o077 == 0
    found = logins.user_for(ann)
    assert found is not None
    assert (found.user, found.uid) == ("ann", 1000)
    again = logins.mint("ann", 1000)
    assert logins.user_for(ann) is None
    reread = Logins(tmp_path).user_for(again)  # read back after a restart
    assert reread is not None
    assert reread.user == "ann"
    bob_found = Logins(tmp_path).user_for(bob)
    assert bob_found is not None
    assert (bob_found.user, bob_found.uid) == ("bob", None)
    assert logins.user_for("") is None


def test_the_login_url_uses_public_url_and_refuses_when_the_console_is_off(
    tmp_path: Path,
) -> None:
    logins = Logins(tmp_path)
    with pytest.raises(Refused, match=r"\[web\] listen"):
        logins.login(WebConfig(), None, {"uid": 1000, "user": "ann", "channel": "cli"})
    web = WebConfig(listen="127.0.0.1:0", public_url="https://ops.example")
    minted = logins.login(web, 4242, {"uid": 1000, "user": "ann", "channel": "cli"})
    assert minted["url"].startswith("https://ops.example/login?token=")
    token = minted["url"].split("token=")[1]
    found = logins.user_for(token)
    assert found is not None
    assert (found.user, found.uid) == ("ann", 1000)
