"""Cron on three nodes: a fire time runs once for the whole cluster."""

from __future__ import annotations

from tests.cluster.conftest import TTL, owned
from tests.e2e.harness import Daemon, wait_event, wait_for

PAYROLL = """name = "payroll"
[run]
exec = ["sh", "-c", "echo ran >> ran.txt"]
cwd = "."

[[trigger]]
type = "cron"
schedule = "0 9 1 * *"
"""


def test_a_missed_cron_fire_runs_once_for_the_cluster_when_all_three_restart(
    three: list[Daemon], pg_dsn: str
) -> None:
    n1 = three[0]
    spec = n1.write_spec("payroll", PAYROLL)
    n1.ctl("create", str(spec), check=True)
    for d in three:
        d.stop()
    for i, d in enumerate(three, 1):  # 40 days later, every node at once
        d.config.write_text(
            'log_format = "json"\nclock_offset = 3456000\n'
            f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n{i}"\nlease_ttl = "{TTL}s"\n'
        )
        d.start(wait=False)
    for d in three:
        d.wait_ready()

    def owners() -> list[Daemon]:
        return [d for d in three if "payroll" in owned(d)]

    (owner,) = wait_for(owners, timeout=30, what="the node that claimed payroll")
    finished = wait_event(owner, "payroll", "run.finished")
    assert finished["data"]["status"] == "ok"
    # the catch-up is decided as the triggers are armed; suspend waits for the lock
    owner.ctl("suspend", "payroll", check=True)
    assert len(owners()) == 1  # no other node runs it (not even blocked)
    wakes = owner.json("log", "payroll", "--type", "wake.requested")
    assert [w["data"]["trigger"] for w in wakes] == ["cron"]
    assert (n1.root / "ran.txt").read_text() == "ran\n"
