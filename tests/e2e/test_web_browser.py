"""The web console in a real headless Chromium (Debian's ``chromium``, driven
by Playwright for Python; .ci/run installs it where it is missing): log in with
the token, watch the table update live, filter a timeline, open a diff,
approve and deny from the inbox, resolve a blocked session, and be refused
without a login or with a bad CSRF token.

Screenshots of the main pages are written to tests/output/screenshots/
(tests.e2e.browsing); with SESSIOND_SCREENSHOTS=DIR they are copied there too
(that is how docs/img/ was made).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
from playwright.sync_api import Browser

from tests.e2e.browsing import (
    PHONE,
    WAIT_MS,
    browser_fixture,
    open_console,
    overflow,
    shoot,
    shots_fixture,
)
from tests.e2e.harness import Daemon, running, short_dir, wait_event
from tests.e2e.test_web import blocked_victim
from tests.e2e.webclient import WEB

__all__ = ["browser_fixture", "shots_fixture"]  # the module's fixtures (tests.e2e.browsing)


def test_log_in_with_the_token_and_see_a_session_appear_live(browser: Browser, shots: Path) -> None:
    with running(WEB) as d:
        blocked_victim(d, "waiting")
        page, _ = open_console(browser, d)
        page.wait_for_selector("#live:text('live')")
        page.wait_for_selector('tr[data-name="waiting"]')
        page.evaluate("window.notReloaded = true")
        ws = d.root / "ws-fresh"
        ws.mkdir()
        spec = f'name = "fresh"\nagent = "ann"\n[run]\nexec = ["true"]\ncwd = "{ws}"\n'
        d.ctl("create", str(d.write_spec("fresh", spec)), check=True)
        row = page.wait_for_selector('tr[data-name="fresh"]')
        assert row is not None
        assert "created" in row.inner_text()
        d.ctl("activate", "fresh", check=True)
        page.wait_for_selector('tr[data-name="fresh"] td.s-terminated')
        assert page.evaluate("window.notReloaded") is True  # updated in place
        page.select_option("select[name=state]", "blocked")
        page.wait_for_function(
            "() => document.querySelectorAll('#rows tr').length === 1"
            " && document.querySelector('#rows tr').dataset.name === 'waiting'"
        )
        page.select_option("select[name=state]", "")
        page.wait_for_selector('tr[data-name="fresh"]')
        shoot(page, shots, "table")


def test_filter_a_timeline_and_open_a_diff(browser: Browser, shots: Path) -> None:
    with running(WEB) as d:
        blocked_victim(d)
        page, _ = open_console(browser, d)
        page.goto(page.url + "s/victim")
        page.wait_for_selector("#timeline .ev")
        assert page.locator("#state").inner_text() == "blocked"
        page.evaluate("window.notReloaded = true")
        d.ctl("approve", "victim", check=True)  # the page follows the session live
        page.wait_for_selector('#timeline .ev[data-type="run.finished"]')
        page.wait_for_selector("#state:text('terminated')")
        assert page.evaluate("window.notReloaded") is True
        wait_event(
            d, "victim", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        page.reload()  # the artifacts list is drawn with the page
        page.wait_for_selector("#timeline .ev")
        every = page.locator("#timeline .ev").count()
        page.fill("input[name=type]", "tool.finished,run.finished")
        page.click("#timeline-filter button[type=submit]")
        page.wait_for_function(
            "() => { const rows = [...document.querySelectorAll('#timeline .ev')];"
            " return rows.length === 2 && rows.every(r =>"
            " ['tool.finished', 'run.finished'].includes(r.dataset.type)); }"
        )
        page.fill("input[name=type]", "")
        page.fill("input[name=grep]", "f\\.txt=absent")
        page.click("#timeline-filter button[type=submit]")
        page.wait_for_function(
            "() => { const rows = [...document.querySelectorAll('#timeline .ev')];"
            " return rows.length === 1 && rows[0].dataset.type === 'tool.started'; }"
        )
        assert every > 2
        shoot(page, shots, "session")
        page.click("a.diff")
        added = page.wait_for_selector("#diff .d-add")
        assert added is not None
        assert added.inner_text() == "+new"
        shoot(page, shots, "diff")


def test_approve_one_from_the_inbox_it_runs_exactly_once_and_deny_another(
    browser: Browser, shots: Path
) -> None:
    with running(WEB) as d:
        ws_one = blocked_victim(d, "one", line="one")
        ws_two = blocked_victim(d, "two", line="two")
        page, base = open_console(browser, d)
        page.goto(base + "/inbox")
        assert page.locator("article.approval").count() == 2
        shoot(page, shots, "inbox")
        one = page.locator('article.approval[data-session="one"]')
        one.locator("input.note").fill("ship it")
        one.locator("button.approve").click()
        one.locator(".answer:text('approved')").wait_for()
        wait_event(d, "one", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
        assert (ws_one / "f.txt").read_text() == "one\n"  # it ran, once
        types = [r["type"] for r in d.json("log", "one")]
        assert types.count("tool.started") == 1
        assert types.count("approval.granted") == 1
        (granted,) = d.json("log", "one", "--type", "approval.granted")
        assert granted["data"]["channel"] == "web"
        assert granted["data"]["by"] == "ship it"
        two = page.locator('article.approval[data-session="two"]')
        two.locator("input.note").fill("too risky")
        two.locator("button.deny").click()
        two.locator(".answer:text('denied')").wait_for()
        (denied,) = d.json("log", "two", "--type", "approval.denied")
        assert denied["data"]["reason"] == "too risky"
        assert denied["data"]["channel"] == "web"
        assert not (ws_two / "f.txt").exists()
        # answered: the confirm page (where a one-shot link will land) says so
        page.goto(f"{base}/approvals/one/{granted['data']['call']}")
        page.wait_for_selector("#answered")
        page.goto(base + "/inbox")
        page.wait_for_selector("#inbox-empty")
        assert [r["type"] for r in d.json("log", "one")].count("tool.started") == 1


SPEC = """name = "job"
[run]
exec = ["sh", "-c", "echo ran >> out.txt; echo done"]
cwd = "."
idempotency = "unsafe"
resume = "never-rerun"
writes = ["out.txt"]
retries = 0
"""


def test_resolve_a_blocked_session_from_its_page(browser: Browser, shots: Path) -> None:
    root = short_dir()
    try:
        d = Daemon(root, 'fault = "after-started"\n' + WEB).start()  # dies mid-run
        d.ctl("create", str(d.write_spec("job", SPEC)), check=True)
        d.ctl("activate", "job")
        assert d.proc is not None
        d.proc.wait(60)
        d.config.write_text('log_format = "json"\n' + WEB)
        d.start()
        wait_event(d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked")
        page, base = open_console(browser, d)
        page.goto(base + "/s/job")
        buttons = page.locator("button.resolve")
        gate = orjson.loads(d.ctl("--json", "gate", "job").stdout)  # exit 1: not ok
        assert sorted(buttons.all_inner_texts()) == sorted(gate["options"])
        shoot(page, shots, "blocked")
        buttons.filter(has_text="discard").click()
        page.wait_for_selector("#flash:has-text('discard')")
        wait_event(d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
        assert (root / "out.txt").read_text() == "ran\n"
        (resolved,) = d.json("log", "job", "--type", "recovery.resolved")
        assert resolved["data"]["option"] == "discard"
        assert resolved["data"]["channel"] == "web"
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_without_the_token_or_with_a_bad_csrf_token_the_browser_is_refused(
    browser: Browser,
) -> None:
    with running(WEB) as d:
        blocked_victim(d)
        page, base = open_console(browser, d)
        stranger = browser.new_context().new_page()
        answer = stranger.goto(base + "/")
        assert answer is not None
        assert answer.status == 401
        assert "sessionctl web" in stranger.locator("#error").inner_text()
        stranger.context.close()
        page.goto(base + "/inbox")
        statuses = page.evaluate(
            """async () => {
              const post = (headers) => fetch('/api/s/victim/approve', {method: 'POST',
                  credentials: 'same-origin', body: '{}',
                  headers: Object.assign({'Content-Type': 'application/json'}, headers)});
              const bad = await post({'X-CSRF-Token': 'f'.repeat(64)});
              const none = await post({});
              return [bad.status, none.status, (await bad.json()).error.code];
            }"""
        )
        assert statuses == [403, 403, "csrf"]
        assert d.json("show", "victim")["pending_approvals"]  # still waiting


def test_an_approve_link_from_a_notice_works_once_in_the_browser(
    browser: Browser, shots: Path
) -> None:
    """The approve link of the notice the JSON webhook got, opened with no login:
    the confirm page, the button, the step runs once; the link again is refused."""
    from tests.e2e.receivers import receiving
    from tests.e2e.test_links import config, free_port, links_of

    with receiving() as receiver, running(config(receiver, free_port())) as d:
        ws = blocked_victim(d, "deploy", line="deployed")
        approve = links_of(receiver, "deploy")["approve_url"]
        context = browser.new_context(viewport={"width": PHONE, "height": 800})
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        page.goto(approve)
        page.wait_for_selector("#confirm")
        assert d.json("show", "deploy")["pending_approvals"]  # opening it answered nothing
        shoot(page, shots, "link")
        assert re.fullmatch(r"in \d+ min", page.locator(".expires time").inner_text())
        assert overflow(page) == 0  # nothing runs off the phone's screen
        page.fill("input[name=note]", "lgtm")
        page.click("#confirm")
        page.wait_for_selector("#done")
        wait_event(
            d, "deploy", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        assert (ws / "f.txt").read_text() == "deployed\n"
        (granted,) = d.json("log", "deploy", "--type", "approval.granted")
        assert (granted["data"]["channel"], granted["data"]["by"]) == ("link", "lgtm")
        again = page.goto(approve)
        assert again is not None
        assert again.status == 409
        assert "already used" in page.locator("#error").inner_text()
        # its own heading and what to do (not the 401's "Not here"), and no raw backticks
        assert page.locator("#heading").inner_text().startswith("Not possible now")
        assert "`" not in page.locator("main").inner_text()
        shoot(page, shots, "error-409")
        assert overflow(page) == 0
        assert [r["type"] for r in d.json("log", "deploy")].count("tool.started") == 1
        context.close()
