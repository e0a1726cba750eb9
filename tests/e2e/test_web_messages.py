"""The session page's messages view, a page at a time, newest first: a session
with 250 messages shows its last 100, and older pages on request (before, the
page showed the last 200 of the first 1,000, so a long session's news never
appeared)."""

from __future__ import annotations

import re
from pathlib import Path

from sessiond.log.bundle import export_session
from sessiond.log.event_data import EventData, MessageReceived, SessionCreated
from sessiond.log.journal import Journal
from sessiond.log.store.files import FileStore
from tests.e2e.harness import running
from tests.e2e.webclient import WEB, logged_in
from tests.helpers import arun

COUNT = 250


def chatty_bundle(folder: Path) -> Path:
    store = FileStore(folder / "craft")

    async def go() -> None:
        await (await store.create("chatty", spec='name = "chatty"\n')).close()
        journal = await Journal.open(store, "chatty")
        events: list[EventData] = [SessionCreated(name="chatty", goal="talk a lot")]
        events += [MessageReceived(sender="ann", text=f"note {i:03d}") for i in range(1, COUNT + 1)]
        for event in events:
            await journal.append(event)
        await journal.close()

    arun(go())
    out = folder / "chatty.bundle"
    export_session(store, "chatty", out)
    return out


def notes(body: bytes) -> list[int]:
    return [int(n) for n in re.findall(rb"note (\d{3})", body)]


def test_the_session_page_shows_the_newest_messages_and_older_pages_on_request() -> None:
    with running(WEB) as d:
        d.ctl("import", str(chatty_bundle(d.root)), check=True)
        client = logged_in(d)
        page = client.get("/s/chatty")
        assert page.status == 200, page.body[:300]
        assert notes(page.body) == list(range(151, COUNT + 1))  # the newest 100, in order
        assert b"Goal: talk a lot" not in page.body
        found = re.search(rb'id="older" href="(/s/chatty\?before=\d+)#messages"', page.body)
        assert found is not None
        older = client.get(found.group(1).decode())
        assert older.status == 200
        assert notes(older.body) == list(range(51, 151))
        assert b'id="newest"' in older.body
        found = re.search(rb'id="older" href="(/s/chatty\?before=\d+)#messages"', older.body)
        assert found is not None
        oldest = client.get(found.group(1).decode())
        assert notes(oldest.body) == list(range(1, 51))
        assert b"Goal: talk a lot" in oldest.body  # the view's first item
        assert b'id="older"' not in oldest.body  # nothing before it
        d.ctl("send", "chatty", "note 999", check=True)  # a new message is on the first page
        assert notes(client.get("/s/chatty").body)[-1] == 999
        api = client.get("/api/s/chatty/messages").json()  # the same pages, as JSON
        assert [m["content"] for m in api["messages"]][-2:] == ["note 250", "note 999"]
        older_api = client.get(f"/api/s/chatty/messages?before={api['older']}").json()
        assert [m["content"] for m in older_api["messages"]][-1] == "note 151"  # 999 came
        bad = client.get("/s/chatty?before=x")
        assert bad.status == 400
        assert b"before must be a seq" in bad.body
        # digits to str.isdigit() but no seq: "²" (int() refuses it: it was a 500), U+0661
        for odd in ("%C2%B2", "%D9%A1", "1%C2%B2"):
            for path in (f"/s/chatty?before={odd}", f"/api/s/chatty/messages?before={odd}"):
                answer = client.get(path)
                assert answer.status == 400, (path, answer.body[:300])
                assert b"before must be a seq" in answer.body
