"""Secrets in what names a thing, and in what crosses sessions, through the real
daemon: a key of a step's arguments, a step's ``key=``, a message one session's
program sends another. None of it is stored; a masked step key still tells two
steps apart and finds its step in a later run of the turn.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.e2e.harness import Daemon, running, wait_event
from tests.e2e.scan import assert_written_nowhere

KEY = "sk-" + "Qx8" * 9  # matches the spec's pattern below
OTHER = "sk-" + "Wv5" * 9  # another secret, the same pattern
REPO = Path(__file__).parents[2]

SPEC = """name = "{name}"
redact = ["sk-[A-Za-z0-9]{{20,}}"]
[run]
kind = "sdk"
exec = ["{python}", "{root}/{name}.py"]
cwd = "{root}"
env = {{ PYTHONPATH = "{repo}" }}
[policy]
ask = ["pay"]
"""

# Secrets are read from files: a spec is stored, so none can be written in it.
ARGS_KEY = """from pathlib import Path
from sessiond.sdk import connect

key = Path("key.txt").read_text().split()[0]
with connect() as run:
    run.step("lookup", lambda: "found", args={"token:" + key: "v", "q": 1},
             side_effect="read", idempotency="safe", resume="replay-from-event")
    run.complete()
"""

# Two steps whose keys hold two secrets, then one a person approves: the
# continuation replays both (the ledger shows each ran once).
STEP_KEY = """from pathlib import Path
from sessiond.sdk import connect

key, other = Path("key.txt").read_text().split()

def charge(tag):
    with open("ledger.txt", "a") as f:
        f.write(tag + "\\n")
    return tag

with connect() as run:
    kw = dict(side_effect="read", idempotency="safe", resume="replay-from-event")
    # what tells the two charges apart is in args too (twin keyed steps are refused)
    first = run.step("charge", lambda: charge("a"), key="order-" + key, args={"n": 1}, **kw)
    second = run.step("charge", lambda: charge("b"), key="order-" + other, args={"n": 2}, **kw)
    run.step("pay", lambda: charge("pay " + first + second))
    run.complete()
"""

SEND = """from pathlib import Path
from sessiond.sdk import connect

key = Path("key.txt").read_text().split()[0]
with connect() as run:
    run.send("bob", "the key is " + key + ", keep it")
    run.complete()
"""

# The recipient masks nothing of its own: what it stores is what came masked.
BOB = """name = "bob"
[run]
exec = ["true"]
cwd = "{root}"
"""


def _start(d: Daemon, name: str, program: str) -> None:
    (d.root / f"{name}.py").write_text(program)
    (d.root / "key.txt").write_text(f"{KEY} {OTHER}\n")
    spec = SPEC.format(name=name, python=sys.executable, root=d.root, repo=REPO)
    d.ctl("create", str(d.write_spec(name, spec)), check=True)
    d.ctl("activate", name, check=True)


def _completed(d: Daemon, name: str) -> None:
    done = wait_event(d, name, "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
    assert done["data"]["outcome"] == "completed", d.json("log", name)


def test_a_secret_in_a_key_of_a_steps_args_is_stored_nowhere() -> None:
    with running("snapshot_every = 10\n") as d:
        _start(d, "args", ARGS_KEY)
        _completed(d, "args")
        (intent,) = d.json("log", "args", "--type", "tool.intent")
        args = intent["data"]["args"]
        assert len(args) == 2
        assert args.get("q") == 1
        (masked,) = (k for k in args if k != "q")
        assert masked.startswith("token:redacted."), args
        assert_written_nowhere(d, [KEY])


def test_a_secret_in_a_step_key_is_stored_nowhere_and_the_step_is_still_found() -> None:
    with running("snapshot_every = 10\n") as d:
        _start(d, "keyed", STEP_KEY)
        wait_event(d, "keyed", "approval.requested")
        # the masks outlive the daemon (its redact.key): a restart finds the steps
        d.stop()
        d.start()
        assert (d.state_dir / "redact.key").stat().st_mode & 0o777 == 0o600
        d.ctl("approve", "keyed", check=True)
        _completed(d, "keyed")
        # each step ran once: the masked keys told the two apart, and the
        # continuation (after a restart) found both again by them
        assert (d.root / "ledger.txt").read_text() == "a\nb\npay ab\n"
        intents = d.json("log", "keyed", "--type", "tool.intent")
        keys = [i["data"]["key"] for i in intents if i["data"]["tool"] == "charge"]
        assert len(set(keys)) == 2, keys  # two secrets, two keys
        assert all(k.startswith("order-redacted.") for k in keys), keys
        assert_written_nowhere(d, [KEY, OTHER])


def test_a_message_a_program_sends_is_masked_by_the_senders_patterns() -> None:
    with running("snapshot_every = 10\n") as d:
        d.ctl("create", str(d.write_spec("bob", BOB.format(root=d.root))), check=True)
        _start(d, "alice", SEND)
        _completed(d, "alice")
        (message,) = d.json("log", "bob", "--type", "message.received")
        assert message["data"]["text"] == "the key is [REDACTED], keep it"
        assert message["data"]["sender"] == "alice"
        assert KEY not in d.ctl("--json", "replay", "bob", "--view", "messages").stdout
        assert_written_nowhere(d, [KEY])


VALUE = "payroll-" + "s3cr" * 5  # a [run] secrets value: it matches no pattern
HOLDS = """name = "holds"
[run]
exec = ["true"]
cwd = "{root}"
secrets = {{ API_KEY = {{ file = "{file}" }} }}
"""


def test_a_secret_value_is_masked_before_the_sessions_first_run() -> None:
    """Its value is known from the moment the session is in the table (at its
    create, at each load), not only once a run read it."""
    with running() as d:
        (d.root / "api.key").write_text(VALUE + "\n")
        spec = HOLDS.format(root=d.root, file=d.root / "api.key")
        d.ctl("create", str(d.write_spec("holds", spec)), check=True)
        d.ctl("send", "holds", f"here it is: {VALUE}", check=True)
        d.stop()
        d.start()  # loaded again: read again
        d.ctl("send", "holds", f"again: {VALUE}", check=True)
        texts = [m["data"]["text"] for m in d.json("log", "holds", "--type", "message.received")]
        assert texts == ["here it is: [REDACTED]", "again: [REDACTED]"]
        assert d.json("show", "holds")["state"] == "created"  # it never ran
        assert_written_nowhere(d, [VALUE])
