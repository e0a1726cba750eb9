"""``GET /metrics`` through the real daemon, read with prometheus_client's own
parser: the values are what the test made happen."""

from __future__ import annotations

from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import Daemon, running, wait_event
from tests.e2e.test_web import blocked_victim
from tests.e2e.webclient import WEB, Client, login

JOB = 'name = "{name}"\n[run]\nexec = ["sh", "-c", "{script}"]\ncwd = "."\nretries = 0\n'


def scrape(client: Client, **kw: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = client.get("/metrics", **kw)
    assert answer.status == 200, answer
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    values = {}
    for family in text_string_to_metric_families(answer.body.decode()):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def run_to_end(d: Daemon, name: str, script: str) -> None:
    d.ctl("create", str(d.write_spec(name, JOB.format(name=name, script=script))), check=True)
    d.ctl("activate", name, check=True)
    wait_event(d, name, "run.finished")
    wait_event(d, name, "lifecycle.changed",
               match=lambda r: r["data"]["to"] in ("terminated", "blocked"))  # fmt: skip


def test_metrics_count_what_happened_without_a_login_on_loopback() -> None:
    with running(WEB) as d:
        run_to_end(d, "good", "true")
        run_to_end(d, "bad", "exit 3")
        blocked_victim(d)
        base, _ = login(d)
        m = scrape(Client(base))  # no cookie, no token: loopback
        assert m[("sessiond_runs_total", (("outcome", "ok"),))] == 1
        assert m[("sessiond_runs_total", (("outcome", "failed"),))] == 1
        assert m[("sessiond_runs_total", (("outcome", "killed"),))] == 0
        assert m[("sessiond_approvals_pending", ())] == 1
        states: dict[str, int] = {}
        for row in d.json("ps"):
            states[row["state"]] = states.get(row["state"], 0) + 1
        for state in ("created", "ready", "running", "sleeping", "suspended", "blocked",
                      "terminated"):  # fmt: skip
            assert m[("sessiond_sessions", (("state", state),))] == states.get(state, 0), state
        logs = {name: d.json("log", name) for name in ("good", "bad", "victim")}
        appended = sum(len(records) for records in logs.values())
        assert m[("sessiond_events_appended_total", ())] == appended
        started = sum(r["type"] == "run.started" for rs in logs.values() for r in rs)
        gates = sum(r["type"] == "gate.evaluated" for rs in logs.values() for r in rs)
        assert m[("sessiond_wake_to_exec_seconds_count", ())] == started == 2
        assert m[("sessiond_gate_seconds_count", ())] == gates
        assert m[("sessiond_wake_to_exec_seconds_sum", ())] > 0
        assert m[("sessiond_fsync_seconds_count", ())] > 0  # durability "fsync"
        assert m[("sessiond_notify_failures_total", ())] == 0


def test_metrics_off_loopback_need_the_login_token() -> None:
    config = '[web]\nlisten = "0.0.0.0:0"\nbehind_proxy = true\n'
    with running(config) as d:
        base, token = login(d)
        port = base.rsplit(":", 1)[1]
        client = Client(f"http://127.0.0.1:{port}")
        refused = client.get("/metrics")
        assert refused.status == 401
        assert Client(client.base, cookie="wrong").get("/metrics").status == 401
        m = scrape(client, headers={"Authorization": f"Bearer {token}"})
        assert m[("sessiond_approvals_pending", ())] == 0


def test_failed_deliveries_of_a_notify_target_are_counted() -> None:
    """sessiond_notify_failures_total was always 0: nothing counted into it."""
    from tests.e2e.receivers import receiving

    with receiving(status=503) as receiver:
        config = (
            WEB + f'[[notify]]\nname = "hook"\nurl = "json://{receiver.url}/h"\n'
            'events = ["run.failed"]\nretry_min = "50ms"\nretry_max = "100ms"\n'
        )
        with running(config) as d:
            run_to_end(d, "bad", "exit 3")
            receiver.wait(lambda reqs: len(reqs) >= 2)  # refused twice at least
            base, _ = login(d)
            failed = scrape(Client(base))[("sessiond_notify_failures_total", ())]
            status = orjson.loads(d.ctl("--json", "notify").stdout)["targets"][0]  # exit 1
            assert failed >= 2
            assert failed <= status["failed_total"]  # counted by the target itself
