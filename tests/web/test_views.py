"""What the console's pages compute from events: artifacts named, diffs, expiry."""

from __future__ import annotations

from typing import Any

from sessiond.web.views import artifact_refs, diff_lines, expires


def ref(n: int, name: str) -> dict[str, Any]:
    return {"ref": "sha256:" + f"{n:x}" * 64, "name": name, "size": 3, "media_type": "text/plain"}


def test_every_artifact_an_event_names_is_listed_once_newest_first() -> None:
    records = [
        {"seq": 3, "type": "tool.finished", "data": {"output": ref(1, "out"), "diff": ref(2, "d")}},
        {"seq": 5, "type": "session.merged", "data": {"artifacts": [ref(3, "a"), ref(1, "out")]}},
        {"seq": 6, "type": "run.finished", "data": {"stdout": None, "status": "ok"}},
    ]
    found = artifact_refs(records)
    assert [(a["name"], a["seq"]) for a in found] == [("a", 5), ("out", 5), ("d", 3)]
    assert [a["diff"] for a in found] == [False, False, True]


def test_a_unified_diff_is_split_into_kinds_of_lines() -> None:
    text = "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1,2 @@\n keep\n-old\n+new\n"
    assert [kind for kind, _ in diff_lines(text)] == ["file", "file", "hunk", "ctx", "del", "add"]


def test_an_approval_expires_its_ttl_after_it_was_asked() -> None:
    assert expires("2026-12-01T09:00:00.123456Z", 3600) == "2026-12-01T10:00:00Z"
    assert expires(None, 3600) is None
    assert expires("not a time", 3600) is None
