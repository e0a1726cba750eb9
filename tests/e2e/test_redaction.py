"""Redaction through the real daemon (docs/design.md section 8, "Secrets and redaction").

A secret that reaches a session (in a message, a program's output, a wake's
details, a tool call, a model's text, a compaction summary) is stored nowhere:
not in the log, the messages view, the artifacts, the snapshots, or a bundle.
``[run] secrets`` reach the program and nothing else; run tokens are masked in
program output.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

from tests.e2e.harness import SESSIONCTL, Daemon, running, wait_event

KEY = "sk-" + "Zq7" * 9  # matches the spec's pattern below
REPO = Path(__file__).parents[2]

# Prints its wake (message text, changed paths) to stdout and stderr.
ECHO = """import os, sys
wake = open(os.environ["SESSIOND_WAKE_FILE"]).read()
print("wake:", wake)
print("wake:", wake, file=sys.stderr)
"""

# A compaction command whose summary holds the secret (read from a file: a spec
# is stored, so the secret cannot be written in it).
COMPACT = """import sys
sys.stdin.read()
print("summary: the key is " + open(sys.argv[1]).read().strip())
"""

SPEC = """name = "red"
redact = ["sk-[A-Za-z0-9]{{20,}}"]
[run]
exec = ["{python}", "{root}/echo.py"]
cwd = "{root}/ws"
retries = 0
[compact]
exec = ["{python}", "{root}/compact.py", "{root}/key.txt"]
[[trigger]]
type = "message"
[[trigger]]
type = "watch"
paths = ["inbox/*"]
"""


def _bundle(d: Daemon, name: str) -> bytes:
    """``sessionctl export NAME -o -``, uncompressed (the tar's members in the clear)."""
    done = subprocess.run(
        [SESSIONCTL, "export", name, "-o", "-"], env=d.env, capture_output=True, check=True
    )
    return gzip.decompress(done.stdout)


def _stored(d: Daemon, name: str) -> dict[str, bytes]:
    """Every file the daemon keeps for the session: log, spec, artifacts, snapshots."""
    folder = d.state_dir / "sessions" / name
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _assert_nowhere(d: Daemon, name: str, secret: str) -> dict[str, bytes]:
    """The secret is in no view, no bundle and (once the daemon has stopped and
    written its snapshots) no stored file; returns the stored files."""
    raw = secret.encode()
    assert secret not in d.ctl("--json", "log", name, check=True).stdout
    assert secret not in d.ctl("--json", "replay", name, "--view", "messages", check=True).stdout
    assert raw not in _bundle(d, name)
    d.stop()
    stored = _stored(d, name)
    assert any(p.startswith("snapshots/") for p in stored)
    assert any(p.startswith("artifacts/") for p in stored)
    leaks = [p for p, data in stored.items() if raw in data]
    assert not leaks, f"the secret is stored in {leaks}"
    return stored


def test_a_secret_in_messages_output_wakes_and_summaries_is_stored_nowhere() -> None:
    with running("snapshot_every = 10\n") as d:
        ws = d.root / "ws"
        (ws / "inbox").mkdir(parents=True)
        (d.root / "echo.py").write_text(ECHO)
        (d.root / "compact.py").write_text(COMPACT)
        (d.root / "key.txt").write_text(KEY + "\n")
        spec = SPEC.format(python=sys.executable, root=d.root)
        d.ctl("create", str(d.write_spec("red", spec)), check=True)
        wait_event(d, "red", "lifecycle.changed", match=lambda r: r["data"]["to"] == "sleeping")
        # a message (its text is in the mailbox, the wake's details and the output)
        d.ctl("send", "red", f"the api key is {KEY}, keep it", check=True)
        first = wait_event(d, "red", "run.finished")
        assert first["data"]["status"] == "ok"
        # a changed path that holds the secret (the watch wake's details, the output)
        (ws / "inbox" / f"{KEY}.txt").write_text("x")
        second = wait_event(d, "red", "run.finished", since=first["seq"] + 1, match=lambda r: True)
        assert second["data"]["status"] == "ok"
        d.ctl("compact", "red", "--keep", "0", check=True)

        (compacted,) = d.json("log", "red", "--type", "context.compacted")
        assert compacted["data"]["summary"] == "summary: the key is [REDACTED]"
        (message,) = d.json("log", "red", "--type", "message.received")
        assert message["data"]["text"] == "the api key is [REDACTED], keep it"
        wakes = d.json("log", "red", "--type", "wake.requested")
        assert {"text": "the api key is [REDACTED], keep it"}.items() <= wakes[0]["data"][
            "details"
        ].items()
        assert any("[REDACTED].txt" in str(w["data"]["details"]) for w in wakes)
        stdout = first["data"]["stdout"]["ref"][7:]
        artifacts = d.state_dir / "sessions" / "red" / "artifacts"
        assert b"[REDACTED]" in (artifacts / stdout).read_bytes()
        _assert_nowhere(d, "red", KEY)


AGENT = """from pathlib import Path
from sessiond.sdk import RemoteError, connect

key = Path("key.txt").read_text().strip()
with connect() as run:
    run.step(
        "http_get", lambda: "body", args={"url": "https://example.test", "auth": "Bearer " + key},
        side_effect="read", idempotency="safe", resume="replay-from-event",
        observe=lambda body: "fetched with " + key,
    )
    run.model_call("m1", {"q": key}, lambda: {"a": 42}, text=lambda r: "the answer is " + key)
    try:  # a result holding the secret could not be replayed once masked: refused
        run.step("leak", lambda: "the key is " + key, side_effect="read", idempotency="safe",
                 resume="replay-from-event")
    except RemoteError as exc:
        Path("refused.txt").write_text(exc.code)
    run.complete(summary="done with " + key)
"""

SDK_SPEC = """name = "agent"
redact = ["sk-[A-Za-z0-9]{{20,}}"]
[run]
kind = "sdk"
exec = ["{python}", "{root}/agent.py"]
cwd = "{root}"
env = {{ PYTHONPATH = "{repo}" }}
"""


def test_a_secret_in_an_sdk_programs_tool_call_and_model_text_is_stored_nowhere() -> None:
    with running("snapshot_every = 10\n") as d:
        (d.root / "agent.py").write_text(AGENT)
        (d.root / "key.txt").write_text(KEY)
        spec = SDK_SPEC.format(python=sys.executable, root=d.root, repo=REPO)
        d.ctl("create", str(d.write_spec("agent", spec)), check=True)
        d.ctl("activate", "agent", check=True)
        done = wait_event(
            d, "agent", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        assert done["data"]["outcome"] == "completed"
        intent = d.json("log", "agent", "--type", "tool.intent")[0]
        assert intent["data"]["args"]["auth"] == "Bearer [REDACTED]"
        observed = d.json("log", "agent", "--type", "observation.projected")[0]
        assert observed["data"]["text"] == "fetched with [REDACTED]"
        assert (d.root / "refused.txt").read_text() == "invalid_input"
        leak = d.json("log", "agent", "--type", "tool.finished")[-1]["data"]
        assert (leak["tool"], leak["status"], leak["error_class"]) == (
            "leak",
            "error",
            "validation",
        )
        (responded,) = d.json("log", "agent", "--type", "model.responded")
        assert responded["data"]["text"] == "the answer is [REDACTED]"
        _assert_nowhere(d, "agent", KEY)


TOKEN_SPEC = """name = "tok"
[run]
kind = "sdk"
exec = ["{python}", "-c", "{program}"]
cwd = "{root}"
"""
# Prints its own run token, then fails, naming it in its error output too.
PRINT_TOKEN = (
    "import os, sys; t = os.environ['SESSIOND_TOKEN']; open('token.txt', 'w').write(t); "
    "print('my token', t); print('token', t, file=sys.stderr)"
)


def test_a_run_token_printed_by_its_program_is_masked() -> None:
    with running("snapshot_every = 10\n") as d:
        spec = TOKEN_SPEC.format(python=sys.executable, program=PRINT_TOKEN, root=d.root)
        d.ctl("create", str(d.write_spec("tok", spec)), check=True)
        d.ctl("activate", "tok", check=True)
        finished = wait_event(d, "tok", "run.finished")
        token = (d.root / "token.txt").read_text()
        assert len(token) > 20
        artifacts = d.state_dir / "sessions" / "tok" / "artifacts"
        out = (artifacts / finished["data"]["stdout"]["ref"][7:]).read_bytes()
        assert out == b"my token [REDACTED]\n"
        err = (artifacts / finished["data"]["stderr"]["ref"][7:]).read_bytes()
        assert err == b"token [REDACTED]\n"
        _assert_nowhere(d, "tok", token)


API_KEY = "payroll-" + "k3y" * 6  # matches no pattern: masked because it is a secret
DB_PASS = "db-" + "pa55" * 5
SECRETS_SPEC = """name = "{name}"
[run]
exec = ["{python}", "-c", "{program}"]
cwd = "{root}"
retries = 0
secrets = {{ API_KEY = {{ env = "{var}" }}, DB_PASS = {{ file = "{file}" }} }}
"""
# Writes what it sees (for the test), then prints its secrets.
USE_SECRETS = (
    "import os, sys; k, p = os.environ['API_KEY'], os.environ['DB_PASS']; "
    "open('seen.txt', 'w').write(k + ' ' + p); print('key', k, 'pass', p); "
    "print('pass', p, file=sys.stderr)"
)


def _secrets_spec(d: Daemon, name: str, var: str, file: Path) -> str:
    return SECRETS_SPEC.format(
        name=name, python=sys.executable, program=USE_SECRETS, root=d.root, var=var, file=file
    )


def test_run_secrets_reach_the_program_and_are_stored_nowhere() -> None:
    with running("snapshot_every = 10\n", env={"PAYROLL_API_KEY": API_KEY}) as d:
        secret_file = d.root / "db.pass"
        secret_file.write_text(DB_PASS + "\n")  # the final newline is not part of it
        spec = _secrets_spec(d, "pay", "PAYROLL_API_KEY", secret_file)
        d.ctl("create", str(d.write_spec("pay", spec)), check=True)
        d.ctl("activate", "pay", check=True)
        finished = wait_event(d, "pay", "run.finished")
        assert finished["data"]["status"] == "ok"
        assert (d.root / "seen.txt").read_text() == f"{API_KEY} {DB_PASS}"
        artifacts = d.state_dir / "sessions" / "pay" / "artifacts"
        out = (artifacts / finished["data"]["stdout"]["ref"][7:]).read_bytes()
        assert out == b"key [REDACTED] pass [REDACTED]\n"
        (created,) = d.json("log", "pay", "--type", "session.created")
        assert created["data"]["spec"]["run"]["secrets"] == {
            "API_KEY": {"env": "PAYROLL_API_KEY", "file": None},
            "DB_PASS": {"env": None, "file": str(secret_file)},
        }
        bundle = _bundle(d, "pay")
        assert API_KEY.encode() not in bundle
        assert DB_PASS.encode() not in bundle
        stored = _assert_nowhere(d, "pay", API_KEY)
        assert "spec.toml" in stored
        assert not [p for p, data in stored.items() if DB_PASS.encode() in data]


def test_a_secret_that_cannot_be_read_fails_the_start_naming_it() -> None:
    with running() as d:
        missing = d.root / "nowhere.pass"
        spec = _secrets_spec(d, "nokey", "NO_SUCH_VARIABLE_HERE", d.root / "db.pass")
        (d.root / "db.pass").write_text(DB_PASS)
        d.ctl("create", str(d.write_spec("nokey", spec)), check=True)
        d.ctl("activate", "nokey", check=True)
        failed = wait_event(d, "nokey", "run.finished")
        assert failed["data"]["status"] == "failed"
        error = failed["data"]["error"]
        assert "secret API_KEY" in error
        assert "NO_SUCH_VARIABLE_HERE" in error
        assert not (d.root / "seen.txt").exists()  # the program never ran
        spec = _secrets_spec(d, "nofile", "HOME", missing)
        d.ctl("create", str(d.write_spec("nofile", spec)), check=True)
        d.ctl("activate", "nofile", check=True)
        failed = wait_event(d, "nofile", "run.finished")
        assert failed["data"]["status"] == "failed"
        assert f"secret DB_PASS: cannot read the file {missing}" in failed["data"]["error"]
        assert not (d.root / "seen.txt").exists()
        shown = d.json("show", "nofile")
        assert shown["state"] == "blocked", shown
