"""The console a person reads in Chromium (Playwright, tests.e2e.browsing): a
session's history grouped by turn and run, with durations, relative times and
a compact view; every filter, page and toggle in the address, restored with
Back; per-row actions that follow the transition table; the approvals tab's
count; the inbox's relative expiry and its answer with a message; error pages
with their own heading; and no page wider than a 390 px phone.
"""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Browser, Page

from tests.e2e.browsing import (
    DESKTOP,
    PHONE,
    RAW_TIME,
    browser_fixture,
    open_console,
    overflow,
    shoot,
    shots_fixture,
)
from tests.e2e.harness import Daemon, running, wait_event
from tests.e2e.test_web import blocked_victim
from tests.e2e.webclient import WEB

__all__ = ["browser_fixture", "shots_fixture"]  # the module's fixtures

EXACT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
CHAT = """name = "chat"
goal = "answer each message"
[run]
exec = ["true"]
cwd = "{ws}"
retries = 0
[[trigger]]
type = "message"
"""


def plain(d: Daemon, name: str, extra: str = "") -> None:
    """A session with no program: created, and it stays so."""
    d.ctl("create", str(d.write_spec(name, f'name = "{name}"\n{extra}')), check=True)


def two_turns(d: Daemon) -> None:
    """``chat`` runs twice, each run its own turn (activated, then woken by a message)."""
    ws = d.root / "ws-chat"
    ws.mkdir()
    d.ctl("create", str(d.write_spec("chat", CHAT.format(ws=ws))), check=True)
    d.ctl("activate", "chat", check=True)
    first = wait_event(d, "chat", "run.finished")
    d.ctl("send", "chat", "again", check=True)
    wait_event(d, "chat", "run.finished", since=first["seq"] + 1)


def texts(page: Page, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_inner_texts()]


def no_raw_times(page: Page) -> None:
    body = page.locator("body").inner_text()
    assert not re.search(RAW_TIME, body), body


def test_the_history_is_grouped_by_turn_and_run_with_durations_and_a_compact_view(
    browser: Browser, shots: Path
) -> None:
    with running(WEB) as d:
        two_turns(d)
        page, base = open_console(browser, d)
        page.goto(base + "/s/chat")
        page.wait_for_function(
            "() => document.querySelectorAll('#timeline details.turn').length === 2"
        )
        turns = page.locator("#timeline > details.turn")
        assert turns.count() == 2
        for i in range(2):
            turn = turns.nth(i)
            assert turn.locator("> summary").inner_text().startswith(f"turn {i + 1}")
            (run,) = turn.locator("details.run").all()
            summary = run.locator("> summary").inner_text()
            assert re.search(r"^run \S+ ok · [\d.]+ m?s · ", summary), summary
            types = run.locator(".ev").evaluate_all("rows => rows.map(r => r.dataset.type)")
            assert (types[0], types[-1]) == ("run.started", "run.finished"), types
            # the turn holds its lead-up (from the wake) and its end (leaving running)
            own = turn.locator("> .ev").evaluate_all("rows => rows.map(r => r.dataset.type)")
            assert (own[0], own[-1]) == ("wake.requested", "lifecycle.changed"), own
        # what woke the second turn is between the turns, not in either
        between = page.locator("#timeline > .ev").evaluate_all(
            "rows => rows.map(r => r.dataset.type)"
        )
        assert "message.received" in between
        # relative times, the exact one on hover; no raw RFC 3339 anywhere
        times = page.locator("#timeline time.rel")
        assert times.count() > 4
        assert re.fullmatch(r"just now|\d+(\.\d)? s ago", times.first.inner_text())
        assert EXACT.match(times.first.get_attribute("title") or "")
        no_raw_times(page)
        shoot(page, shots, "history")
        # compact: every group closed, in the address, kept by a reload
        page.check("#compact")
        page.wait_for_url(re.compile(r"compact=1"))
        assert page.evaluate(
            "[...document.querySelectorAll('#timeline details')].every(d => !d.open)"
        )
        assert not page.locator("#timeline details.run .ev").first.is_visible()
        shoot(page, shots, "history-compact")
        page.reload()
        page.wait_for_selector("#timeline details.turn")
        assert page.is_checked("#compact")
        assert page.evaluate(
            "[...document.querySelectorAll('#timeline details')].every(d => !d.open)"
        )
        # the filter too; Back restores the view before it
        page.fill("input[name=type]", "run.finished")
        page.click("#timeline-filter button[type=submit]")
        page.wait_for_url(re.compile(r"type=run\.finished"))
        page.wait_for_function("() => document.querySelectorAll('#timeline .ev').length === 2")
        page.go_back()
        page.wait_for_function(
            "() => document.querySelectorAll('#timeline details.turn').length === 2"
            " && document.querySelector('input[name=type]').value === ''"
        )
        assert page.is_checked("#compact")
        page.go_back()
        page.wait_for_function("() => !document.querySelector('#compact').checked")
        page.wait_for_function(
            "() => [...document.querySelectorAll('#timeline details')].every(d => d.open)"
        )


def test_the_tables_filters_and_page_are_in_the_address_and_paged_as_sorted(
    browser: Browser,
) -> None:
    with running(WEB) as d:
        for i in range(51):
            plain(d, f"n{i:02d}", '[labels]\nteam = "a"\n')
        plain(d, "other")
        page, base = open_console(browser, d)
        page.goto(base + "/?label=team%3Da")  # a shared link: the filter applies
        page.wait_for_selector("#pageinfo:text('page 1 of 2')")
        assert page.input_value("input[name=label]") == "team=a"
        assert page.locator("#count").inner_text() == "51 of 52"
        # sorted by name: the pager says previous and next, not newer and older
        assert page.locator("#prev").inner_text() == "\u2039 previous"
        assert page.locator("#next").inner_text() == "next \u203a"
        assert "newer" not in page.content()
        assert "older" not in page.locator("main").inner_text()
        page.click("#next")
        page.wait_for_selector("#pageinfo:text('page 2 of 2')")
        assert re.search(r"label=team%3Da.*page=2", page.url), page.url
        assert texts(page, "#rows tr td.name") == ["n50"]
        page.go_back()
        page.wait_for_selector("#pageinfo:text('page 1 of 2')")
        assert "page=" not in page.url
        page.go_forward()
        page.wait_for_selector("#pageinfo:text('page 2 of 2')")
        fresh = page.context.new_page()  # a bookmark of page 2
        fresh.goto(base + "/?label=team%3Da&page=2")
        fresh.wait_for_selector("#pageinfo:text('page 2 of 2')")
        assert texts(fresh, "#rows tr td.name") == ["n50"]
        page.select_option("select[name=state]", "blocked")
        page.wait_for_url(re.compile(r"state=blocked"))
        page.wait_for_selector("#count:text('0 of 52')")
        assert "page=" not in page.url


def test_row_and_page_actions_follow_the_transition_table(browser: Browser) -> None:
    with running(WEB) as d:
        blocked_victim(d, "asks")
        plain(d, "idle")  # no [run] program: nothing to activate
        plain(d, "startable", f'[run]\nexec = ["true"]\ncwd = "{d.root}"\n')
        plain(d, "gone")
        d.ctl("cancel", "gone", check=True)
        page, base = open_console(browser, d)
        page.on("dialog", lambda dialog: dialog.accept())  # cancel's "are you sure?"
        page.wait_for_selector('tr[data-name="gone"]')
        acts = 'tr[data-name="{}"] td.actions button'
        assert texts(page, acts.format("gone")) == []
        assert texts(page, acts.format("idle")) == ["suspend", "cancel"]
        assert texts(page, acts.format("startable")) == ["activate", "suspend", "cancel"]
        assert texts(page, acts.format("asks")) == ["suspend", "cancel"]
        page.locator(acts.format("idle")).filter(has_text="suspend").click()
        page.wait_for_selector('tr[data-name="idle"][data-state="suspended"]')
        page.wait_for_function(
            "() => [...document.querySelectorAll('tr[data-name=idle] td.actions button')]"
            ".map(b => b.textContent).join() === 'resume,cancel'"
        )
        assert d.json("show", "idle")["state"] == "suspended"
        page.locator(acts.format("idle")).filter(has_text="cancel").click()
        page.wait_for_selector('tr[data-name="idle"][data-state="terminated"]')
        page.wait_for_function(
            "() => !document.querySelector('tr[data-name=idle] td.actions button')"
        )
        # a session's page: the same buttons, and they follow its state live
        page.goto(base + "/s/gone")
        assert page.locator("#actions button").count() == 0
        assert "terminated" in page.locator("#actions").inner_text()
        plain(d, "later")
        page.goto(base + "/s/later")
        assert texts(page, "#actions button") == ["suspend", "cancel"]
        page.click("#actions button:text('suspend')")
        page.wait_for_function(
            "() => [...document.querySelectorAll('#actions button')].map(b => b.textContent)"
            ".join() === 'resume,cancel'"
        )


def test_the_approvals_tab_counts_and_the_inbox_answers_with_a_message(
    browser: Browser, shots: Path
) -> None:
    with running(WEB) as d:
        blocked_victim(d, "one")
        blocked_victim(d, "two")
        page, base = open_console(browser, d)
        assert page.locator("#pending").inner_text() == "2"
        blocked_victim(d, "three")  # the tab's count follows, live
        page.wait_for_selector("#pending:text('3')")
        page.goto(base + "/inbox")
        expires = page.locator('article[data-session="one"] .expires time')
        assert re.fullmatch(r"in (59|60) min", expires.inner_text()), expires.inner_text()
        assert EXACT.match(expires.get_attribute("title") or "")
        asked = page.locator('article[data-session="one"] time').first
        assert asked.inner_text() == "just now" or asked.inner_text().endswith("ago")
        no_raw_times(page)
        card = page.locator('article[data-session="one"]')
        card.locator("details.reply summary").click()
        card.locator("textarea.message").fill("use the staging host instead")
        card.locator("button.send").click()
        card.locator(".sent").wait_for()
        (got,) = d.json("log", "one", "--type", "message.received")
        user = page.locator("#user").inner_text()
        assert (got["data"]["sender"], got["data"]["text"]) == (
            user,
            "use the staging host instead",
        )
        shoot(page, shots, "inbox-reply")
        assert d.json("show", "one")["pending_approvals"]  # the approval stays open
        page.locator('article[data-session="two"] button.approve').click()
        wait_event(d, "two", "approval.granted")
        page.goto(base + "/")
        assert page.locator("#pending").inner_text() == "2"


def test_error_pages_say_what_happened_and_what_to_do(browser: Browser) -> None:
    with running(WEB) as d:
        page, base = open_console(browser, d)
        stranger = browser.new_context().new_page()
        answer = stranger.goto(base + "/s/anything")
        assert answer is not None
        assert answer.status == 401
        assert stranger.locator("#heading").inner_text().startswith("Sign in first")
        assert stranger.locator("#todo code").first.inner_text() == "sessionctl web"
        assert "`" not in stranger.locator("main").inner_text()
        stranger.context.close()
        missing = page.goto(base + "/s/nosuch")
        assert missing is not None
        assert missing.status == 404
        assert page.locator("#heading").inner_text().startswith("Not found")
        assert "nosuch" in page.locator("#error").inner_text()
        assert page.locator("#user").is_visible()  # still signed in, and it says so
        bad = page.goto(base + "/?state=bogus")  # a shared address with a typo
        assert bad is not None
        assert bad.status == 400
        assert page.locator("#heading").inner_text().startswith("That request is not right")
        assert "no state 'bogus'" in page.locator("#error").inner_text()


PAGES = [
    ("table", "/"),
    ("session-blocked", "/s/one-with-a-rather-long-name-that-goes-on"),
    ("session-done", "/s/done"),
    ("history-chat", "/s/chat"),
    ("inbox", "/inbox"),
    ("error-404", "/s/nosuch"),
]


def test_no_page_runs_off_a_phone_or_a_desktop_screen(browser: Browser, shots: Path) -> None:
    with running(WEB) as d:
        blocked_victim(d, "one-with-a-rather-long-name-that-goes-on")
        blocked_victim(d, "done")
        d.ctl("approve", "done", check=True)
        wait_event(d, "done", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
        two_turns(d)
        long = "/a/path/" + "without-any-space-" * 12
        plain(d, "wordy", f'goal = "{long}"\nagent = "an-agent-with-a-long-name"\n')
        timer = '[[trigger]]\ntype = "every"\ninterval = "1h"\n'
        plain(d, "ticker", f'[run]\nexec = ["true"]\ncwd = "{d.root}"\n{timer}')
        diff = d.json("log", "done", "--type", "tool.finished")[0]["data"]["diff"]["ref"]
        call = d.json("show", "one-with-a-rather-long-name-that-goes-on")["pending_approvals"][0]
        pages = [
            *PAGES,
            ("session-wordy", "/s/wordy"),
            ("session-ticker", "/s/ticker"),
            ("diff", f"/s/done/artifact/{diff}"),
            ("confirm", f"/approvals/one-with-a-rather-long-name-that-goes-on/{call['call']}"),
        ]
        for width in (DESKTOP, PHONE):
            page, base = open_console(browser, d, width)
            for name, path in pages:
                page.goto(base + path)
                if name == "table":
                    page.wait_for_selector('tr[data-name="wordy"]')
                    # a timer's next wake reads relative, as everywhere
                    wakes = page.locator('tr[data-name="ticker"] time.rel').first.inner_text()
                    assert re.fullmatch(r"in (59|60) min", wakes), wakes
                if name.startswith(("session", "history")):
                    page.wait_for_function(
                        "() => document.querySelector('#timeline-filter').dataset.loaded"
                    )
                if name == "session-ticker":
                    assert re.fullmatch(r"in (59|60) min", page.inner_text("#next-wake time"))
                shoot(page, shots, f"{name}-{width}")
                body = page.locator("body").inner_text()
                assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", body), f"a raw time on {path}"
                assert overflow(page) == 0, f"{path} is {overflow(page)} px too wide at {width} px"
            stranger = browser.new_context(viewport={"width": width, "height": 800}).new_page()
            stranger.goto(base + "/")
            shoot(stranger, shots, f"error-401-{width}")
            assert overflow(stranger) == 0, f"the 401 page is too wide at {width} px"
            stranger.context.close()
            page.context.close()
