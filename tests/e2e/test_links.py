"""Signed one-shot approve / deny links in approval notices (docs/design.md section 11),
with the real daemon, Apprise's JSON webhook to a real local receiver, and the
links used over HTTP as a phone's browser would (the browser test,
test_links_browser.py, clicks one in Chromium): a GET only shows the confirm
page, the POST answers once, and every misuse is refused with its reason."""

from __future__ import annotations

import base64
import shutil
import socket
import sys
import time
import urllib.parse
from typing import Any

import orjson

from tests.e2e.harness import Daemon, running, wait_event, wait_for
from tests.e2e.receivers import Receiver, receiving
from tests.e2e.test_web import blocked_victim
from tests.e2e.webclient import Answer, Client

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(receiver: Receiver, port: int, extra: str = "") -> str:
    return f"""
[web]
listen = "127.0.0.1:{port}"

[[notify]]
name = "phone"
url = "json://{receiver.url}/hook"
events = ["approval.requested"]
links = true
retry_min = "50ms"
retry_max = "200ms"
{extra}
"""


def links_of(receiver: Receiver, session: str) -> dict[str, Any]:
    """The approval notice of ``session`` the receiver got: its payload."""

    def found(requests: list[Any]) -> list[dict[str, Any]]:
        return [
            n
            for n in (orjson.loads(r.body) for r in requests if r.status < 300)
            if n["session"] == session and n["event"] == "approval.requested"
        ]

    [notice] = receiver.wait(found)
    return dict(notice)


def use(
    url: str,
    method: str = "GET",
    note: str = "",
    path: str | None = None,
    origin: str | None = None,
) -> Answer:
    """Open (GET) or confirm (POST) a link, as a browser with no login would."""
    parts = urllib.parse.urlsplit(url)
    client = Client(f"{parts.scheme}://{parts.netloc}")
    target = f"{path or parts.path}?{parts.query}"
    if method == "GET":
        return client.get(target)
    body = urllib.parse.urlencode({"note": note}).encode()
    headers = {**FORM, "Origin": origin} if origin else FORM
    return client.request("POST", target, raw=body, headers=headers)


def ended(record: dict[str, Any]) -> bool:
    return bool(record["data"]["to"] == "terminated")


def states(d: Daemon, name: str) -> list[str]:
    return [r["type"] for r in d.json("log", name)]


def test_an_approve_link_answers_once_and_a_second_use_is_refused_even_after_a_restart() -> None:
    port = free_port()
    with receiving() as receiver, running(config(receiver, port)) as d:
        ws = blocked_victim(d)
        notice = links_of(receiver, "victim")
        approve, deny = notice["approve_url"], notice["deny_url"]
        assert approve.startswith(f"http://127.0.0.1:{port}/approvals/victim/")
        assert f"approve: {approve}" in notice["message"]
        assert f"deny: {deny}" in notice["message"]
        # a GET (a link preview, a scanner) shows the confirm page and answers nothing
        page = use(approve)
        assert page.status == 200, page.body[:300]
        assert b'id="confirm"' in page.body
        assert b"sh" in page.body  # the command it would run is shown
        assert d.json("show", "victim")["pending_approvals"]
        done = use(approve, "POST", note="from my phone")
        assert done.status == 200, done.body[:400]
        assert b'id="done"' in done.body
        wait_event(d, "victim", "lifecycle.changed", match=ended)
        assert (ws / "f.txt").read_text() == "new\n"  # it ran, once
        (granted,) = d.json("log", "victim", "--type", "approval.granted")
        assert granted["data"]["channel"] == "link"
        assert granted["data"]["user"] == "notify:phone"
        assert granted["data"]["by"] == "from my phone"
        again = use(approve, "POST")
        assert again.status == 409
        assert b"already used" in again.body
        assert use(deny, "POST").status == 409  # the approval's other link goes with it
        assert d.stop() == 0
        d.start()
        # durable: refused as used (not merely as answered) after a restart
        for method in ("GET", "POST"):
            after = use(approve, method)
            assert after.status == 409, after.body[:300]
            assert b"already used" in after.body
        assert states(d, "victim").count("tool.started") == 1
        assert states(d, "victim").count("approval.granted") == 1


def test_a_deny_link_denies_and_nothing_runs() -> None:
    with receiving() as receiver, running(config(receiver, free_port())) as d:
        ws = blocked_victim(d)
        notice = links_of(receiver, "victim")
        assert use(notice["deny_url"]).status == 200
        done = use(notice["deny_url"], "POST", note="not today")
        assert done.status == 200, done.body[:400]
        assert b"denied" in done.body
        (denied,) = d.json("log", "victim", "--type", "approval.denied")
        assert denied["data"]["channel"] == "link"
        assert denied["data"]["user"] == "notify:phone"
        assert denied["data"]["reason"] == "not today"
        assert not (ws / "f.txt").exists()
        assert "approval.granted" not in states(d, "victim")
        refused = use(notice["approve_url"], "POST")
        assert refused.status == 409
        assert b"already used" in refused.body


def test_an_expired_link_is_refused_and_the_approval_still_waits() -> None:
    with (
        receiving() as receiver,
        running(config(receiver, free_port(), 'link_ttl = "1h"')) as d,
    ):
        ws = blocked_victim(d)
        approve = links_of(receiver, "victim")["approve_url"]
        assert use(approve).status == 200  # fine now
        assert d.stop() == 0
        # two hours on: the daemon's clock (a test-only offset) is past the link's expiry
        d.config.write_text("clock_offset = 7200\n" + d.config.read_text())
        d.start()
        for method in ("GET", "POST"):
            answer = use(approve, method)
            assert answer.status == 410, answer.body[:300]
            assert b"expired at" in answer.body
        assert d.json("show", "victim")["pending_approvals"]
        assert not (ws / "f.txt").exists()


def tampered(url: str) -> str:
    """The same link with its payload's answer turned from approve to deny and
    re-encoded (the signature kept)."""
    parts = urllib.parse.urlsplit(url)
    token = urllib.parse.parse_qs(parts.query)["link"][0]
    payload, sig = token.split(".")
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    fields = orjson.loads(raw)
    fields[5] = "deny"
    forged = base64.urlsafe_b64encode(orjson.dumps(fields)).rstrip(b"=").decode()
    return urllib.parse.urlunsplit(parts._replace(query=f"link={forged}.{sig}"))


def test_a_tampered_link_or_one_used_on_another_approval_is_refused() -> None:
    with receiving() as receiver, running(config(receiver, free_port())) as d:
        ws = blocked_victim(d)
        blocked_victim(d, "other")
        approve = links_of(receiver, "victim")["approve_url"]
        other = links_of(receiver, "other")["approve_url"]
        for bad in (tampered(approve), approve[:-3], approve + "x"):
            for method in ("GET", "POST"):
                answer = use(bad, method)
                assert answer.status == 403, (bad, answer.body[:300])
                assert b"not valid" in answer.body
        # the victim's link on the other session's address
        wrong = use(approve, "POST", path=urllib.parse.urlsplit(other).path)
        assert wrong.status == 403
        assert b"is for call" in wrong.body
        # another site's page that posts the link (its Origin) answers nothing
        forged = use(approve, "POST", origin="https://evil.example")
        assert forged.status == 403
        assert b"may not answer here" in forged.body
        assert d.json("show", "victim")["pending_approvals"]
        assert d.json("show", "other")["pending_approvals"]
        assert not (ws / "f.txt").exists()
        assert use(approve, "POST").status == 200  # the real link still works


CHANGED = """name = "victim"
[run]
exec = ["sh", "-c", "echo changed >> f.txt"]
cwd = "{ws}"
writes = ["f.txt"]
retries = 0
[policy]
ask = ["command"]
"""


def test_a_link_for_a_command_that_changed_since_it_was_sent_is_refused() -> None:
    with receiving() as receiver, running(config(receiver, free_port())) as d:
        ws = blocked_victim(d)
        approve = links_of(receiver, "victim")["approve_url"]
        spec = d.write_spec("victim-new", CHANGED.format(ws=ws))
        d.ctl("apply", "victim", str(spec), check=True)  # the command it would run changed
        for method in ("GET", "POST"):
            answer = use(approve, method)
            assert answer.status == 409, answer.body[:300]
            assert b"changed since this link was sent" in answer.body
        assert d.json("show", "victim")["pending_approvals"]
        assert "approval.granted" not in states(d, "victim")
        assert not (ws / "f.txt").exists()


def test_a_post_whose_form_never_arrives_or_is_refused_leaves_the_link_unused() -> None:
    port = free_port()
    with receiving() as receiver, running(config(receiver, port)) as d:
        ws = blocked_victim(d)
        approve = links_of(receiver, "victim")["approve_url"]
        parts = urllib.parse.urlsplit(approve)
        client = Client(f"http://127.0.0.1:{port}")
        target = f"{parts.path}?{parts.query}"
        # a body over the listener's limit is refused before the link is used
        big = client.request("POST", target, raw=b"note=" + b"x" * (2 << 20), headers=FORM)
        assert big.status == 413
        bad = client.request(
            "POST", target, raw=b"garbage",
            headers={"Content-Type": "multipart/form-data; boundary=x"},
        )  # fmt: skip
        assert bad.status == 400, bad.body[:300]
        assert b"form cannot be read" in bad.body
        assert d.json("show", "victim")["pending_approvals"]
        done = use(approve, "POST", note="second try")
        assert done.status == 200, done.body[:400]
        wait_event(d, "victim", "lifecycle.changed", match=ended)
        assert (ws / "f.txt").read_text() == "new\n"


def test_a_link_does_not_answer_a_session_made_anew_under_the_name_asking_the_same() -> None:
    port = free_port()
    with receiving() as receiver, running(config(receiver, port)) as d:
        ws = blocked_victim(d)
        approve = links_of(receiver, "victim")["approve_url"]
        assert d.stop() == 0
        shutil.rmtree(d.state_dir / "sessions" / "victim")  # the session is gone
        d.start()
        shutil.rmtree(ws)
        blocked_victim(d)  # made anew: the same name, the same command, the same call id
        assert "/approvals/victim/r1.command?" in approve  # the new one asks that call too
        assert d.json("show", "victim")["pending_approvals"]
        for method in ("GET", "POST"):
            answer = use(approve, method)
            assert answer.status == 409, answer.body[:300]
            assert b"changed since this link was sent" in answer.body
        assert "approval.granted" not in states(d, "victim")
        assert not (ws / "f.txt").exists()


THIEF = r"""
import json, sys, urllib.error, urllib.request
out = open("result.txt", "w")
for line in open(sys.argv[1]):  # the notices file: a run of the daemon's user may read it
    notice = json.loads(line)
    if notice["session"] == "victim" and "approve_url" in notice:
        for data in (None, b"note=me"):
            try:
                out.write(f"{urllib.request.urlopen(notice['approve_url'], data).status}\n")
            except urllib.error.HTTPError as exc:
                out.write(f"{exc.code} {exc.read().decode()}\n")
out.close()
"""


def test_a_process_of_a_run_that_reads_a_link_cannot_use_it() -> None:
    jsonl = '[[notify]]\nname = "file"\nurl = "jsonl://notices.jsonl"\nlinks = true\n'
    with receiving() as receiver, running(config(receiver, free_port(), jsonl)) as d:
        ws = blocked_victim(d)
        approve = links_of(receiver, "victim")["approve_url"]
        notices = d.state_dir / "notices.jsonl"
        wait_for(lambda: notices.exists() and "approve_url" in notices.read_text())
        thief = d.root / "ws-thief"
        thief.mkdir()
        (thief / "thief.py").write_text(THIEF)
        # The notices file is hidden from runs (tests/e2e/test_sandbox.py): the link
        # reaches the thief some other way, as a copy in its workspace.
        shutil.copy(notices, thief / "stolen.jsonl")
        spec = (
            f'name = "thief"\n[run]\nexec = ["{sys.executable}", "thief.py", "stolen.jsonl"]\n'
            f'cwd = "{thief}"\n'
        )
        d.ctl("create", str(d.write_spec("thief", spec)), check=True)
        d.ctl("activate", "thief", check=True)
        wait_event(d, "thief", "run.finished")
        tries = (thief / "result.txt").read_text().splitlines()
        assert [t[:4] for t in tries if t[:1].isdigit()] == ["403 ", "403 "], tries
        stolen = (thief / "result.txt").read_text()
        assert "process of a run" in stolen or "a run's uid" in stolen
        assert d.json("show", "victim")["pending_approvals"]
        assert not (ws / "f.txt").exists()
        assert use(approve, "POST").status == 200  # a person's use of the same link works
        wait_event(d, "victim", "lifecycle.changed", match=ended)
        assert (ws / "f.txt").read_text() == "new\n"


def test_a_post_begun_before_the_expiry_and_finished_after_it_answers_nothing() -> None:
    port = free_port()
    with (
        receiving() as receiver,
        running(config(receiver, port, 'link_ttl = "4s"')) as d,
    ):
        ws = blocked_victim(d)
        approve = links_of(receiver, "victim")["approve_url"]
        parts = urllib.parse.urlsplit(approve)
        token = urllib.parse.parse_qs(parts.query)["link"][0]
        payload = token.split(".")[0]
        expires = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))[4]
        body = b"note=slowly"
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            head = (
                f"POST {parts.path}?{parts.query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/x-www-form-urlencoded\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            conn.sendall(head.encode() + body[:4])  # the link is checked, the body trickles
            # the rest of the body once the link has expired (the daemon's clock is the
            # wall clock here: no offset)
            wait_for(lambda: time.time() >= expires + 1, what="the link's expiry")
            conn.sendall(body[4:])
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 410"), answer[:300]
        assert b"expired at" in answer
        assert d.json("show", "victim")["pending_approvals"]
        assert "approval.granted" not in states(d, "victim")
        assert not (ws / "f.txt").exists()


def test_a_use_that_cannot_be_recorded_answers_nothing_and_the_link_still_works() -> None:
    with receiving() as receiver, running(config(receiver, free_port())) as d:
        ws = blocked_victim(d)
        approve = links_of(receiver, "victim")["approve_url"]
        used = d.state_dir / "web" / "links-used"
        elsewhere = d.root / "used-elsewhere"
        elsewhere.touch()
        used.symlink_to(elsewhere)  # readable, but never written through (O_NOFOLLOW)
        refused = use(approve, "POST")
        assert refused.status == 503, refused.body[:300]
        assert b"cannot be recorded" in refused.body
        assert d.json("show", "victim")["pending_approvals"]
        used.unlink()
        assert use(approve, "POST").status == 200
        wait_event(d, "victim", "lifecycle.changed", match=ended)
        assert (ws / "f.txt").read_text() == "new\n"
