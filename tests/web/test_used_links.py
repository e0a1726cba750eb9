"""The used links' file (sessiond.web.links.UsedLinks), without a daemon."""

from __future__ import annotations

import asyncio
import stat
import time
from pathlib import Path

from sessiond.notify.links import Link
from sessiond.web.links import KEEP_EXPIRED, UsedLinks
from tests.helpers import arun


def link(call: str, expires: int) -> Link:
    return Link("s", call, "ab" * 16, expires, "approve", "phone")


def test_a_use_is_durable_and_a_second_claim_of_it_fails(tmp_path: Path) -> None:
    later = int(time.time()) + 3600
    used = UsedLinks(tmp_path)

    async def two_at_once() -> list[bool]:
        return list(await asyncio.gather(used.claim(link("c1", later)),
                                         used.claim(link("c1", later))))  # fmt: skip

    assert sorted(arun(two_at_once())) == [False, True]
    path = tmp_path / "web" / "links-used"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = UsedLinks(tmp_path)  # a restart
    assert again.used(link("c1", later))
    assert not again.used(link("c2", later))


def test_long_expired_uses_are_dropped_from_the_file(tmp_path: Path) -> None:
    used = UsedLinks(tmp_path)
    gone = int(time.time()) - KEEP_EXPIRED - 10
    later = int(time.time()) + 3600
    arun(used.claim(link("old", gone)))
    arun(used.claim(link("new", later)))
    again = UsedLinks(tmp_path)
    assert again.used(link("new", later))
    assert not again.used(link("old", gone))
    assert len((tmp_path / "web" / "links-used").read_text().splitlines()) == 1
