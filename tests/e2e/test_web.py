"""The web console through the real daemon (docs/design.md section 11): logins,
CSRF, no CORS, run processes refused, the table's pages, the timeline's
filters, and answers recorded with the web user. HTTP here; the browser tests
(test_web_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import orjson

from tests.e2e.harness import SESSIOND, Daemon, running, short_dir, wait_event
from tests.e2e.webclient import VICTIM, WEB, Client, logged_in, login


def port_of(client: Client) -> int:
    port = urllib.parse.urlsplit(client.base).port
    assert port is not None
    return port


def blocked_victim(d: Daemon, name: str = "victim", line: str = "new") -> Path:
    ws = d.root / f"ws-{name}"
    ws.mkdir()
    d.ctl("create", str(d.write_spec(name, VICTIM.format(name=name, ws=ws, line=line))), check=True)
    d.ctl("activate", name, check=True)
    wait_event(d, name, "approval.requested")
    return ws


def test_sessionctl_web_mints_one_hashed_login_per_user_and_a_new_one_replaces_it() -> None:
    with running(WEB) as d:
        base, first = login(d)
        assert base.startswith("http://127.0.0.1:")
        stored = (d.state_dir / "web" / "logins.json").read_text()
        assert first not in stored  # only its digest is kept
        assert len(orjson.loads(stored)) == 1
        client = Client(base)
        answer = client.get(f"/login?token={first}")
        assert answer.status == 303
        cookie = answer.headers["Set-Cookie"]
        assert f"sessiond_login={first}" in cookie
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        _, second = login(d)
        assert len(orjson.loads((d.state_dir / "web" / "logins.json").read_text())) == 1
        assert client.get(f"/login?token={first}").status == 401  # replaced
        assert Client(base, cookie=first).get("/api/sessions").status == 401
        assert Client(base, cookie=second).get("/api/sessions").status == 200


def test_without_a_login_every_page_and_action_is_refused() -> None:
    with running(WEB) as d:
        blocked_victim(d)
        base, _ = login(d)
        anonymous = Client(base)
        page = anonymous.get("/")
        assert page.status == 401
        assert b"sessionctl web" in page.body  # it says how to log in
        assert anonymous.get("/api/sessions").status == 401
        assert anonymous.get("/s/victim").status == 401
        refused = anonymous.post("/api/s/victim/approve", {})
        assert refused.status == 401
        assert refused.json()["error"]["code"] == "unauthenticated"
        assert Client(base, cookie="not-a-token").get("/inbox").status == 401
        assert d.json("show", "victim")["pending_approvals"]  # nothing was answered


def test_an_action_needs_the_csrf_token_and_another_origin_gets_no_cors() -> None:
    with running(WEB) as d:
        blocked_victim(d)
        client = logged_in(d)
        assert client.post("/api/s/victim/approve", {}).status == 403  # no token
        wrong = client.post("/api/s/victim/approve", {}, headers={"X-CSRF-Token": "0" * 64})
        assert wrong.status == 403
        assert wrong.json()["error"]["code"] == "csrf"
        token = client.csrf()
        evil = {"X-CSRF-Token": token, "Origin": "https://evil.example"}
        cross = client.post("/api/s/victim/approve", {}, headers=evil)
        assert cross.status == 403
        rebound = client.get("/metrics", headers={"Host": f"evil.example:{port_of(client)}"})
        assert rebound.status == 403  # a rebound name gets nothing, not even /metrics
        assert client.get("/api/sessions", headers={"Host": "evil.example"}).status == 403
        assert client.get("/metrics", headers={"Host": "localhost"}).status == 200
        read = client.get("/api/sessions", headers={"Origin": "https://evil.example"})
        assert "Access-Control-Allow-Origin" not in read.headers
        assert "script-src 'self'" in read.headers["Content-Security-Policy"]
        assert read.headers["X-Frame-Options"] == "DENY"
        assert read.headers["Referrer-Policy"] == "no-referrer"
        preflight = client.request("OPTIONS", "/api/s/victim/approve",
                                   headers={"Origin": "https://evil.example"})  # fmt: skip
        assert "Access-Control-Allow-Origin" not in preflight.headers
        assert d.json("show", "victim")["pending_approvals"]  # none of those answered
        ok = client.post("/api/s/victim/approve", {"note": "looks fine"},
                         headers={"X-CSRF-Token": token})  # fmt: skip
        assert ok.status == 200, ok.body
        wait_event(d, "victim", "run.finished")
        (granted,) = d.json("log", "victim", "--type", "approval.granted")
        assert granted["data"]["channel"] == "web"
        assert granted["data"]["user"] == pwd.getpwuid(os.getuid()).pw_name  # the login's
        assert granted["data"]["uid"] == os.getuid()  # who minted it with `sessionctl web`
        assert granted["data"]["by"] == "looks fine"


def test_web_answers_go_through_the_same_checks_and_errors_as_sessionctl() -> None:
    with running(WEB) as d:
        blocked_victim(d)
        client = logged_in(d)
        denied = client.act("/api/s/victim/deny", {"note": "not today"})
        assert denied.status == 200, denied.body
        (record,) = d.json("log", "victim", "--type", "approval.denied")
        assert record["data"]["reason"] == "not today"
        assert record["data"]["channel"] == "web"
        shown = d.ctl("show", "victim", check=True).stdout
        assert f"(uid {os.getuid()}, web)" in shown, shown
        # nothing is pending now: the web and sessionctl refuse alike
        web = client.act("/api/s/victim/approve", {})
        cli = d.ctl("--json", "approve", "victim")
        assert cli.returncode != 0
        cli_error = orjson.loads(cli.stdout)["error"]
        assert web.status == 409
        assert web.json()["error"] == {"code": cli_error["code"], "message": cli_error["message"]}
        missing = client.act("/api/s/nobody/approve", {})
        assert missing.status == 404
        assert missing.json()["error"]["code"] == "no_such_session"
        bad = client.act("/api/s/victim/resolve", {"option": "sideways"})
        assert bad.status == 400


def test_the_process_table_is_filtered_and_paginated_on_the_server() -> None:
    root = short_dir()
    specs = root / "specs"
    specs.mkdir()
    for i in range(55):
        team = "red" if i % 5 == 0 else "blue"
        (specs / f"s{i:03d}.toml").write_text(
            f'name = "s{i:03d}"\nagent = "{team}-bot"\nlabels = {{ team = "{team}" }}\n'
        )
    try:
        d = Daemon(root, f'specs = "{specs}"\n' + WEB).start()
        client = logged_in(d)
        first = client.get("/api/sessions").json()
        assert (first["total"], first["pages"], len(first["rows"])) == (55, 2, 50)
        second = client.get("/api/sessions?page=2").json()
        assert [r["name"] for r in second["rows"]] == [f"s{i:03d}" for i in range(50, 55)]
        red = client.get("/api/sessions?label=team%3Dred").json()
        assert red["total"] == 11
        assert {r["labels"]["team"] for r in red["rows"]} == {"red"}
        assert client.get("/api/sessions?agent=blue-bot").json()["total"] == 44
        assert client.get("/api/sessions?state=created").json()["total"] == 55
        assert client.get("/api/sessions?state=running").json()["total"] == 0
        bad = client.get("/api/sessions?state=dancing")
        assert bad.status == 400
        assert "the states are" in bad.json()["error"]["message"]
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_timeline_filters_by_type_regex_and_time() -> None:
    with running(WEB) as d:
        blocked_victim(d)
        client = logged_in(d)
        client.act("/api/s/victim/approve", {})
        wait_event(d, "victim", "run.finished")
        everything = client.get("/api/s/victim/events").json()
        assert [r["seq"] for r in everything] == list(range(1, len(everything) + 1))
        typed = client.get("/api/s/victim/events?type=tool.finished,run.finished").json()
        assert {r["type"] for r in typed} == {"tool.finished", "run.finished"}
        grep = client.get("/api/s/victim/events?grep=" + urllib.parse.quote("exit=0")).json()
        assert grep
        assert all("exit=0" in r["text"] or "exit" in str(r["data"]) for r in grep)
        middle = everything[len(everything) // 2]
        until = client.get("/api/s/victim/events?until=" + urllib.parse.quote(middle["ts"]))
        assert max(r["ts"] for r in until.json()) <= middle["ts"]
        since = client.get(f"/api/s/victim/events?since={middle['seq']}").json()
        assert since[0]["seq"] == middle["seq"]
        bad = client.get("/api/s/victim/events?grep=" + urllib.parse.quote("(a)\\1"))
        assert bad.status == 400  # the same refusal as sessionctl log --grep
        assert "bounded time" in bad.json()["error"]["message"]


def test_malformed_requests_get_a_clear_error_and_the_daemon_goes_on() -> None:
    with running(WEB) as d:
        blocked_victim(d)
        client = logged_in(d)
        token = client.csrf()
        headers = {"X-CSRF-Token": token, "Content-Type": "application/json"}
        for body in (b"{not json", b"[1, 2]", b'{"call": 7}'):
            answer = client.request("POST", "/api/s/victim/approve", headers=headers, raw=body)
            assert answer.status == 400, (body, answer)
            assert answer.json()["error"]["code"] == "invalid_input"
        huge = client.request("POST", "/api/s/victim/approve", headers=headers,
                              raw=b"{" + b" " * (2 << 20) + b"}")  # fmt: skip
        assert huge.status == 413
        assert client.get("/api/sessions?page=many").status == 400
        assert client.get("/api/s/victim/events?since=tomorrow").status == 400
        assert client.get("/s/no%20such").status == 400  # not a session name
        url = urllib.parse.urlsplit(client.base)
        with socket.create_connection((url.hostname, url.port), timeout=30) as raw:
            raw.sendall(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.")  # an error answer, not a crash
        assert d.json("show", "victim")["pending_approvals"]  # nothing was answered
        assert client.get("/api/sessions").status == 200
        d.ctl("ping", check=True)


PROBE = """import os, subprocess, urllib.request, urllib.error
for name, extra in (("endpoint", []), ("control", ["--socket", os.environ["CONTROL"]])):
    done = subprocess.run(["sessionctl", *extra, "web"], capture_output=True, text=True)
    open(name + ".txt", "w").write(f"{done.returncode} {done.stderr}")
req = urllib.request.Request(os.environ["CONSOLE"] + "/api/sessions",
                             headers={"Cookie": "sessiond_login=" + os.environ["TOKEN"]})
try:
    out = str(urllib.request.urlopen(req, timeout=20).status)
except urllib.error.HTTPError as exc:
    out = f"{exc.code} {exc.read().decode()}"
open("result.txt", "w").write(out)
"""


def test_a_process_of_a_run_is_refused_on_the_web_listener_even_with_a_login() -> None:
    with running(WEB) as d:
        base, token = login(d)
        ws = d.root / "ws"
        ws.mkdir()
        (ws / "probe.py").write_text(PROBE)
        spec = (
            f'name = "prober"\n[run]\nexec = ["{sys.executable}", "probe.py"]\ncwd = "{ws}"\n'
            f'env = {{ CONSOLE = "{base}", TOKEN = "{token}", CONTROL = "{d.socket}" }}\n'
        )
        d.ctl("create", str(d.write_spec("prober", spec)), check=True)
        d.ctl("activate", "prober", check=True)
        wait_event(d, "prober", "run.finished")
        result = (ws / "result.txt").read_text()
        assert result.startswith("403 "), result
        assert any(
            why in result for why in ("SESSIOND_RUN_MARK", "process of a run", "a run's uid")
        )
        assert Client(base, cookie=token).get("/api/sessions").status == 200  # a person may
        # nor may it mint a login: an operator action, on either socket
        endpoint = (ws / "endpoint.txt").read_text()
        assert not endpoint.startswith("0 "), endpoint
        assert "operator action" in endpoint
        control = (ws / "control.txt").read_text()
        assert not control.startswith("0 "), control
        # the sandbox hides the control socket from runs; unconfined, it answers only ping
        assert "may only ping" in control or "daemon is not reachable" in control, control
        assert Client(base, cookie=token).get("/api/sessions").status == 200  # not replaced


def test_listening_off_loopback_without_tls_or_a_proxy_is_refused_at_start() -> None:
    root = short_dir()
    config = root / "c.toml"
    config.write_text('[web]\nlisten = "0.0.0.0:8765"\n')
    done = subprocess.run(
        [SESSIOND, "--config", str(config), "--state-dir", str(root / "st"),
         "--socket", str(root / "s.sock")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 2
    assert "off loopback" in done.stderr
    assert "tls_cert" in done.stderr
    assert "behind_proxy" in done.stderr


def test_a_taken_port_stops_the_start_with_the_reason_and_a_reload_keeps_the_listener() -> None:
    with running(WEB) as d:
        base, _ = login(d)
        port = port_of(Client(base))
        root = short_dir()
        config = root / "c.toml"
        config.write_text(f'[web]\nlisten = "127.0.0.1:{port}"\n')
        taken = subprocess.run(
            [SESSIOND, "--config", str(config), "--state-dir", str(root / "st"),
             "--socket", str(root / "s.sock")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
        assert taken.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr
        d.config.write_text(d.config.read_text().replace("127.0.0.1:0", "127.0.0.1:1"))
        notes = d.json("reload")["notes"]
        assert "web changes take effect at the next start" in notes
        assert Client(base).get("/metrics").status == 200  # still where it was


def test_sessionctl_web_says_how_to_turn_the_console_on() -> None:
    with running() as d:
        done = d.ctl("web")
        assert done.returncode == 1
        assert "[web] listen" in done.stderr
