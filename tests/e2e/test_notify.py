"""Notifications (docs/design.md section 11) through Apprise's JSON webhook to a real
local HTTP receiver, with the real daemon: each notice carries its stable id,
a kill -9 between the event and its delivery loses nothing, a failing target
is retried and shows as failing in `sessionctl notify`."""

from __future__ import annotations

from typing import Any

import orjson

from tests.e2e.harness import Daemon, running, short_dir, wait_event
from tests.e2e.receivers import Received, Receiver, receiving

ASKS = """name = "{name}"
[run]
exec = ["true"]
cwd = "{ws}"
[policy]
ask = ["command"]
"""


def config(receiver: Receiver, events: str = '["approval.requested"]') -> str:
    return f"""
[web]
public_url = "https://console.example.org/"

[[notify]]
name = "hook"
url = "json://{receiver.url}/hook"
events = {events}
retry_min = "50ms"
retry_max = "200ms"
"""


def ask(d: Daemon, name: str) -> int:
    """A session whose activation asks for an approval; the request's seq."""
    spec = d.write_spec(name, ASKS.format(name=name, ws=short_dir()))
    d.ctl("create", str(spec), check=True)
    d.ctl("activate", name, check=True)
    seq: int = wait_event(d, name, "approval.requested")["seq"]
    return seq


def notices(requests: list[Received]) -> list[dict[str, Any]]:
    """What was accepted (2xx), as the JSON payloads Apprise posted."""
    return [orjson.loads(r.body) for r in requests if r.status < 300]


def with_id(notice_id: str) -> Any:
    return lambda reqs: [n for n in notices(reqs) if n["notice_id"] == notice_id]


def test_a_notice_reaches_a_webhook_with_its_stable_id_and_link() -> None:
    with receiving() as receiver, running(config(receiver)) as d:
        seq = ask(d, "payroll")
        [notice] = receiver.wait(with_id(f"payroll:{seq}"))
        assert notice["session"] == "payroll"
        assert notice["seq"] == str(seq)
        assert notice["event"] == notice["event_type"] == "approval.requested"
        assert notice["title"] == "sessiond: payroll needs approval: command"
        assert notice["link"] == "https://console.example.org/s/payroll"
        assert notice["type"] == "warning"
        assert f"id: payroll:{seq}" in notice["message"]
        assert "sessionctl approve payroll --call" in notice["message"]
        [request] = [r for r in receiver.accepted() if r.path == "/hook"]
        assert request.headers["X-Sessiond-Notice-Id"] == f"payroll:{seq}"
        status = d.json("notify")["targets"]
        assert status[0]["target"] == "hook"
        assert status[0]["state"] == "ok"
        assert status[0]["delivered"] == 1
        assert d.ctl("notify").returncode == 0
        # only what the target asked for: the session's other events made no notice
        assert {n["event"] for n in notices(receiver.requests)} == {"approval.requested"}


def test_a_clean_restart_sends_nothing_twice() -> None:
    with receiving() as receiver, running(config(receiver)) as d:
        first = ask(d, "one")
        receiver.wait(with_id(f"one:{first}"))
        assert d.stop() == 0
        d.start()
        second = ask(d, "two")
        receiver.wait(with_id(f"two:{second}"))
        # delivered in order: a resend of the first would have come before the second
        assert [n["notice_id"] for n in notices(receiver.requests)] == [
            f"one:{first}",
            f"two:{second}",
        ]


def test_a_kill_right_after_the_event_is_durable_delivers_it_after_restart() -> None:
    """The daemon dies (SIGKILL, the fault hook) in the same step that made
    tool.finished durable: its notice was queued, never sent. After a restart it
    is sent, with the id of that record."""
    with receiving() as receiver:
        faulty = 'fault = "after-finished"\n' + config(receiver, '["tool.finished"]')
        with running(faulty) as d:
            spec = d.write_spec("job", f'name = "job"\n[run]\nexec = ["true"]\ncwd = "{d.root}"\n')
            d.ctl("create", str(spec), check=True)
            d.ctl("activate", "job")
            assert d.proc is not None
            assert d.proc.wait(60) == -9  # killed itself right after the append
            assert receiver.requests == []  # nothing was delivered before the kill
            d.config.write_text(d.config.read_text().replace('fault = "after-finished"', ""))
            d.start()
            [finished, *_] = d.json("log", "job", "--type", "tool.finished")
            [notice, *_] = receiver.wait(notices)
            assert notice["notice_id"] == f"job:{finished['seq']}"
            assert notice["event"] == "tool.finished"
            assert "tool.finished" in notice["message"]


def test_a_kill_between_event_and_delivery_still_delivers_after_restart() -> None:
    with receiving(status=503) as receiver, running(config(receiver)) as d:
        seq = ask(d, "victim")
        # the target refuses: the notice is tried, fails, waits for a retry
        receiver.wait(lambda reqs: len(reqs) >= 2)
        failing = d.ctl("--json", "notify")
        assert failing.returncode == 1
        [target] = orjson.loads(failing.stdout)["targets"]
        assert target["state"] == "failing"
        assert target["pending"] == 1
        assert target["delivered"] == 0
        assert "503" in target["last_error"]
        human = d.ctl("notify")
        assert "FAILING" in human.stdout
        assert "503" in human.stdout
        d.kill9()  # never delivered, and the daemon is gone
        with receiver.changed:
            receiver.status = 200
        d.start()
        [notice] = receiver.wait(with_id(f"victim:{seq}"))
        assert notice["event"] == "approval.requested"
        assert d.json("notify")["targets"][0]["delivered"] == 1


def test_a_failing_target_is_retried_until_it_takes_the_notice() -> None:
    with receiving(status=500) as receiver, running(config(receiver, '["run.failed"]')) as d:
        spec = d.write_spec(
            "flaky", f'name = "flaky"\n[run]\nexec = ["false"]\ncwd = "{short_dir()}"\n'
        )
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "flaky", check=True)
        failed = wait_event(d, "flaky", "run.finished")
        assert failed["data"]["status"] == "failed"
        receiver.wait(lambda reqs: len(reqs) >= 3)  # refused three times, tried again each time
        with receiver.changed:
            receiver.status = 200
        [notice, *_] = receiver.wait(notices)
        assert notice["notice_id"] == f"flaky:{failed['seq']}"
        assert notice["event"] == "run.failed"
        assert notice["type"] == "failure"
        status = d.json("notify")["targets"][0]
        assert status["failed_total"] >= 3
        assert status["delivered"] >= 1


def test_a_bad_target_stops_start_up_with_a_clear_error() -> None:
    cases = [
        ('url = "nosuch://x"', "nosuch://… is not a URL Apprise knows"),
        ('url = "json://127.0.0.1:9/h"\nevents = ["tool.finishd"]', "tool.finishd: no such event"),
        ('url = "json://127.0.0.1:9/h"\nevents = ["Blocked!"]', "'Blocked!' is not an event"),
        ('url = "ntfy.sh/topic"', "is not an Apprise URL"),
    ]
    for entry, message in cases:
        d = Daemon(short_dir(), f"[[notify]]\n{entry}\n")
        d.start(wait=False)
        assert d.proc is not None
        assert d.proc.wait(60) in (1, 2)
        d.stop()
        text = " ".join(str(line.get("text", "")) for line in d.lines)
        assert message in text, text


def test_a_fork_is_not_notified_of_what_it_copied_even_after_a_kill() -> None:
    with receiving() as receiver, running(config(receiver)) as d:
        seq = ask(d, "parent")
        receiver.wait(with_id(f"parent:{seq}"))
        d.ctl("fork", "parent", "--as", "kid", check=True)  # its log holds the request too
        assert "approval.requested" in [r["type"] for r in d.json("log", "kid")]
        d.kill9()  # before any checkpoint of the cursor
        d.start()
        other = ask(d, "other")
        receiver.wait(with_id(f"other:{other}"))
        # in order: a notice for the kid's copied request would have come before
        assert [n["notice_id"] for n in notices(receiver.requests)] == [
            f"parent:{seq}",
            f"other:{other}",
        ]
