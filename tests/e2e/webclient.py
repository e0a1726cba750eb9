"""A small HTTP client for the web console tests (http.client: no redirects
followed, no cookie jar but the one login cookie it is given)."""

from __future__ import annotations

import http.client
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.e2e.harness import Daemon

WEB = '[web]\nlisten = "127.0.0.1:0"\n'
VICTIM = """name = "{name}"
[run]
exec = ["sh", "-c", "echo {line} >> f.txt"]
cwd = "{ws}"
writes = ["f.txt"]
retries = 0
[policy]
ask = ["command"]
"""


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Client:
    base: str
    cookie: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Answer:
        url = urllib.parse.urlsplit(self.base)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        sent = dict(self.headers)
        if self.cookie:
            sent["Cookie"] = f"sessiond_login={self.cookie}"
        sent.update(headers or {})
        data = orjson.dumps(body) if body is not None else raw
        if body is not None:
            sent["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=sent)
            res = conn.getresponse()
            return Answer(res.status, res.headers, res.read())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Answer:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Answer:
        return self.request("POST", path, body, **kw)

    def csrf(self) -> str:
        page = self.get("/")
        assert page.status == 200, page
        found = re.search(rb'name="csrf-token" content="([0-9a-f]+)"', page.body)
        assert found is not None
        return found.group(1).decode()

    def act(self, path: str, body: Any = None) -> Answer:
        """A POST as the page's script sends it: cookie and CSRF token."""
        return self.post(path, body, headers={"X-CSRF-Token": self.csrf()})


def login(d: Daemon) -> tuple[str, str]:
    """(the console's base URL, a fresh login token) from the real `sessionctl web`."""
    minted = d.json("web")
    url = urllib.parse.urlsplit(minted["url"])
    token = urllib.parse.parse_qs(url.query)["token"][0]
    return minted["console"], token


def logged_in(d: Daemon) -> Client:
    base, token = login(d)
    client = Client(base)
    answer = client.get(f"/login?token={token}")
    assert answer.status == 303, answer
    client.cookie = token
    return client
