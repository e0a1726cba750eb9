"""Attacks on the web console with bad input, through the real daemon: each
was a 500 (an exception in the daemon) before, and one of those wrote the
caller's login token to the daemon's log (the traceback's locals)."""

from __future__ import annotations

import socket
import urllib.parse

from tests.e2e.harness import running
from tests.e2e.test_web import blocked_victim
from tests.e2e.webclient import WEB, logged_in


def test_a_session_page_renders_with_its_messages() -> None:
    # The messages view became a page ({"messages": [...], ...}) and the console
    # sliced it as a list: every session's page was a 500.
    with running(WEB) as d:
        blocked_victim(d)
        d.ctl("send", "victim", "hello from the operator", check=True)
        client = logged_in(d)
        page = client.get("/s/victim")
        assert page.status == 200, page.body[:300]
        assert b"hello from the operator" in page.body


def test_bad_timeline_bounds_are_invalid_input_not_internal_errors() -> None:
    with running(WEB) as d:
        blocked_victim(d)
        client = logged_in(d)
        for query, needle in [
            ("limit=-5", b"limit"),
            ("limit=0", b"limit"),
            ("since=" + "9" * 5000, b"since"),
            ("limit=" + "9" * 5000, b"limit"),
        ]:
            answer = client.get(f"/api/s/victim/events?{query}")
            assert answer.status == 400, (query, answer.body[:200])
            assert needle in answer.body
        assert client.get("/api/s/victim/events?limit=3").status == 200


def raw_request(base: str, request: bytes) -> bytes:
    port = urllib.parse.urlsplit(base).port
    with socket.create_connection(("127.0.0.1", port or 0), timeout=30) as sock:
        sock.sendall(request)
        return sock.recv(200)


def test_a_non_utf8_cookie_or_bearer_is_no_login_not_a_500() -> None:
    with running(WEB) as d:
        client = logged_in(d)
        for header in (b"Cookie: sessiond_login=\xff\xfe", b"Authorization: Bearer \xff\xfe"):
            answer = raw_request(
                client.base,
                b"GET /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header + b"\r\n\r\n",
            )
            assert answer.startswith(b"HTTP/1.1 401"), answer


def test_the_login_token_never_reaches_the_daemon_log() -> None:
    # Every request above, with a login: an internal error's traceback carried
    # its locals, the Login (token included) among them.
    with running(WEB) as d:
        blocked_victim(d)
        client = logged_in(d)
        for path in ("/s/victim", "/api/s/victim/events?limit=-5", "/api/s/victim/events?since="
                     + "9" * 5000):  # fmt: skip
            client.get(path)
        assert d.ctl("ping").returncode == 0
        d.stop()
        assert client.cookie not in str(d.lines)
