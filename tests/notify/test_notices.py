"""Which records make which notice, and the cursor's file (unit tests of logic)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from sessiond.notify.cursor import Cursor
from sessiond.notify.notices import kinds, notice_for, rendered


def record(etype: str, seq: int = 7, **data: Any) -> dict[str, Any]:
    return {"type": etype, "seq": seq, "ts": "2026-12-01T10:00:00.000000Z", "data": data}


def test_each_notice_event_comes_from_its_records() -> None:
    asked = record("approval.requested", call="c1", tool="pay", args_sha256="x")
    assert kinds(asked) == ["approval.requested"]
    assert kinds(record("lifecycle.changed", to="blocked")) == ["blocked", "lifecycle.changed"]
    done = record("lifecycle.changed", to="terminated", outcome="completed")
    assert kinds(done) == ["completed", "terminated", "lifecycle.changed"]
    cancelled = record("lifecycle.changed", to="terminated", outcome="cancelled")
    assert kinds(cancelled) == ["terminated", "lifecycle.changed"]
    assert kinds(record("run.finished", status="timeout")) == ["run.failed", "run.finished"]
    assert kinds(record("run.finished", status="interrupted")) == ["run.finished"]
    assert kinds(record("run.finished", status="ok")) == ["run.finished"]
    assert kinds(record("budget.exhausted")) == ["budget.exhausted"]
    assert kinds(record("wake.requested", trigger="manual")) == ["wake.requested"]


def test_a_notice_is_only_for_what_the_target_wants_and_names_its_session() -> None:
    rec = record(
        "lifecycle.changed",
        seq=12,
        to="terminated",
        outcome="completed",
        reason="",
        **{"from": "running"},
    )
    assert notice_for("s", rec, frozenset({"blocked", "run.failed"}), None) is None
    raw = notice_for("s", rec, frozenset({"lifecycle.changed"}), None)
    assert raw is not None
    assert raw.event == "lifecycle.changed"
    assert raw.title == "sessiond: s lifecycle.changed"
    notice = notice_for("child", rec, frozenset({"terminated"}), "http://c:8/")
    assert notice is not None
    assert notice.id == "child:12"
    assert notice.event == "terminated"
    assert notice.link == "http://c:8/s/child"
    assert "id: child:12" in notice.body
    # a target that wants both gets one notice, for the more specific event
    both = notice_for("child", rec, frozenset({"terminated", "completed"}), None)
    assert both is not None
    assert both.event == "completed"
    assert both.link is None
    assert both.level == "success"


def test_the_cursor_keeps_the_last_step_and_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "t.cursor"
    cursor = Cursor(path)
    cursor.load()
    assert cursor.new
    cursor.rewrite({"a": 3})
    cursor.advance("a", 5, sync=True)
    cursor.advance("b", 1, sync=False)
    cursor.advance("a", 4, sync=True)  # behind: nothing written
    cursor.close()
    with path.open("ab") as f:
        f.write(b'{"s":"a","q":9')  # a kill in the middle of a write
    again = Cursor(path)
    again.load()
    assert not again.new
    assert again.positions == {"a": 5, "b": 1}
    assert again.since == cursor.since


def test_a_rewrite_keeps_a_step_the_delivery_took_meanwhile(tmp_path: Path) -> None:
    cursor = Cursor(tmp_path / "t.cursor")
    cursor.load()
    cursor.rewrite({"a": 1, "b": 4})
    cursor.advance("a", 6, sync=True)  # the delivery thread, after positions were computed
    cursor.rewrite({"a": 5, "b": 4, "c": 2})
    again = Cursor(tmp_path / "t.cursor")
    again.load()
    assert again.positions == {"a": 6, "b": 4, "c": 2}


def test_actions_are_lines_of_the_text_and_fields_of_a_webhook(tmp_path: Path) -> None:
    from dataclasses import replace

    from sessiond.config import NotifyConfig
    from sessiond.notify.notices import rendered
    from sessiond.notify.target import Target, load_apprise

    rec = record("approval.requested", seq=3, call="c1", tool="pay", args_sha256="x")
    plain = notice_for("s", rec, frozenset({"approval.requested"}), None)
    assert plain is not None
    assert rendered(plain) == plain.body
    notice = replace(plain, actions=(("approve", "https://c/a?t=1"), ("deny", "https://c/d")))
    assert rendered(notice).endswith("\napprove: https://c/a?t=1\ndeny: https://c/d")
    cursor = Cursor(tmp_path / "c")
    hook = Target(NotifyConfig(url="json://127.0.0.1:9/h?+X-A=b"), cursor, load_apprise())
    url = hook.url_for(notice)
    assert url.startswith("json://127.0.0.1:9/h?+X-A=b&")
    assert ":notice_id=s%3A3" in url
    assert ":approve_url=https%3A%2F%2Fc%2Fa%3Ft%3D1" in url
    assert "+X-Sessiond-Notice-Id=s%3A3" in url
    ntfy = Target(NotifyConfig(url="ntfy://ntfy.example/topic"), cursor, load_apprise())
    assert ntfy.url_for(notice) == "ntfy://ntfy.example/topic"  # its own URL: no extras


def test_a_tool_name_cannot_forge_a_line_of_the_notice() -> None:
    # a run's program names its steps: this one's name tries to look like the
    # approval's real approve link, which the notice's text ends with
    tool = "read_file\napprove: https://elsewhere.example/ok\r\ndeny:\u2028x"
    rec = record("approval.requested", call="c1", tool=tool, args_sha256="x")
    notice = notice_for("s", rec, frozenset({"approval.requested"}), None)
    assert notice is not None
    real = (("approve", "https://console/approvals/s/c1?link=a"),)
    text = rendered(dataclasses.replace(notice, actions=real))
    approve_lines = [line for line in text.splitlines() if line.startswith("approve:")]
    assert approve_lines == ["approve: https://console/approvals/s/c1?link=a"]
    assert not any(line.startswith("deny:") for line in text.splitlines())
    assert "\n" not in notice.title
    assert "read_file\\napprove: https://elsewhere.example/ok" in text  # shown, escaped


def test_a_tool_name_cannot_be_a_link_or_a_tag_where_the_target_renders_markup() -> None:
    # Markdown (Slack, Discord, Telegram, ntfy), Slack's own <url|text> and HTML (mail)
    tool = "[Approve](https://evil.example/a) <https://evil.example/b|Deny> <a href=x>y</a>"
    rec = record("approval.requested", call="c1", tool=tool, args_sha256="x")
    notice = notice_for("s", rec, frozenset({"approval.requested"}), "https://console")
    assert notice is not None
    for text in (notice.title, notice.body):
        for c in "[]<":  # no link, no tag: a ">" alone opens neither
            assert c not in text, (c, text)
    assert "\uff3bApprove\uff3d(https://evil.example/a)" in notice.title  # still reads as named
    assert "open: https://console/s/s" in notice.body  # the daemon's own lines are untouched
