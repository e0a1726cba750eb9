"""``migrate --profile P`` changes what the next run gets (issue 13).

It used to record an event and nothing else: runs kept the spec's profile and
no program ever saw a profile's model. Now the next run runs under the session's
profile: its ``model`` as ``SESSIOND_MODEL``, its ``env``, its ``exec`` in place
of the spec's and its ``budget`` keys in place of the spec's.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.e2e.harness import Daemon, running, wait_event

CONFIG = """
[profiles.default]
model = "small-model"
env = { FLAVOUR = "plain" }

[profiles.large]
model = "large-model"
env = { FLAVOUR = "rich" }

[profiles.other]
model = "other-model"
exec = ["sh", "-c", "echo other $SESSIOND_MODEL > seen.txt"]

[profiles.capped]
budget = { runs_per_day = 1 }
"""


def spec(root: Path) -> str:
    return f"""name = "p"
[run]
exec = ["sh", "-c", "echo $SESSIOND_PROFILE $SESSIOND_MODEL $FLAVOUR > seen.txt"]
cwd = "{root}"
[[trigger]]
type = "message"
"""


def run_once(d: Daemon, since: int) -> str:
    d.ctl("activate", "p", check=True)
    wait_event(d, "p", "run.finished", since=since)
    return (d.root / "seen.txt").read_text().strip()


def last_seq(d: Daemon) -> int:
    return int(d.json("show", "p")["seq"])


def test_migrate_profile_changes_model_env_exec_and_budget_of_the_next_run() -> None:
    with running(CONFIG) as d:
        d.ctl("create", str(d.write_spec("p", spec(d.root))), check=True)
        assert run_once(d, 1) == "default small-model plain"

        d.ctl("migrate", "p", "--profile", "large", check=True)
        assert d.json("show", "p")["profile"] == "large"
        assert run_once(d, last_seq(d)) == "large large-model rich"
        started = d.json("log", "p", "--type", "run.started")[-1]
        assert started["data"]["profile"] == "large"

        d.ctl("migrate", "p", "--profile", "other", check=True)  # its own program
        assert run_once(d, last_seq(d)) == "other other-model"

        d.ctl("migrate", "p", "--profile", "capped", check=True)  # one run a day
        done = d.ctl("--json", "gate", "p")
        assert done.returncode == 1  # the gate says no
        gate = orjson.loads(done.stdout)
        budget = next(c for c in gate["checks"] if c["name"] == "budget left")
        assert not budget["ok"]
        assert "runs_per_day" in budget["detail"]

        done = d.ctl("migrate", "p", "--profile", "nope")
        assert done.returncode == 5
        assert "no runner profile 'nope'" in done.stderr
        assert "capped, default, large, other" in done.stderr
        assert d.json("show", "p")["profile"] == "capped"  # nothing recorded
