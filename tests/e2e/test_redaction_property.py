"""A secret pushed through every input the daemon has is written nowhere (a
property test, on one real daemon for all its examples).

Each example makes two secrets: one that matches the session's ``redact`` pattern
and one that is a ``[run] secrets`` value (any text); the run token is a third.
A real SDK program pushes them through step names, keys, argument keys and
values, observations, errors, a refused result, a model call (its name, key,
request and text), ``run.send``, a verification, its output and ``sessionctl
send`` from inside the run. A person pushes them through ``sessionctl send``
(text and sender), the console's approve note and the import of a bundle made
elsewhere. Then every byte the daemon wrote is scanned (tests/e2e/scan.py): the
state dir (logs, snapshots, artifacts, notices), its own log lines, the traces
it exported, ``/metrics``, console pages, ``sessionctl`` views, a trace export
and a bundle export.
"""

from __future__ import annotations

import string
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sessiond.log.bundle import export_session
from sessiond.log.event_data import MessageReceived, SessionCreated, ToolIntent
from sessiond.log.journal import Journal
from sessiond.log.store.files import FileStore
from tests.e2e.harness import SESSIONCTL, Daemon, running, short_dir, wait_event
from tests.e2e.receivers import Receiver, receiving
from tests.e2e.scan import assert_written_nowhere, leaks, written
from tests.e2e.webclient import WEB, Client, logged_in
from tests.helpers import arun

REPO = Path(__file__).parents[2]
PATTERN = "sk-[A-Za-z0-9]{20,}"

SPEC = """name = "{name}"
redact = ["{pattern}"]
[run]
kind = "sdk"
exec = ["{python}", "{ws}/program.py"]
cwd = "{ws}"
env = {{ PYTHONPATH = "{repo}", CTL = "{ctl}" }}
secrets = {{ LIT = {{ file = "{ws}/lit.txt" }} }}
grants = ["send"]
[policy]
ask = ["pay"]
"""
# the recipient of messages: it masks nothing of its own
SINK = """name = "sink"
[run]
exec = ["true"]
cwd = "{root}"
"""

PROGRAM = """import os, subprocess, sys
from pathlib import Path
from sessiond.sdk import RemoteError, connect

S, L, T = Path("secret.txt").read_text(), os.environ["LIT"], os.environ["SESSIOND_TOKEN"]
both, every = S + " " + L, S + " " + L + " " + T  # the token changes each run
print("out", every)
print("err", every, file=sys.stderr)
kw = dict(side_effect="read", idempotency="safe", resume="replay-from-event")


def boom():
    raise RuntimeError("boom " + every)


with connect() as run:
    run.step("tool-" + S, lambda: "r1", args={"k-" + S: "v " + both, "n": {S: [L]}, L: 1},
             key="key-" + S, observe=lambda r: "saw " + every, **kw)
    run.step("lit-" + L, lambda: "r2", args={"k": L}, **kw)
    try:  # a result holding a secret is refused (a masked one could not be replayed)
        run.step("leak", lambda: "res " + S, **kw)
    except RemoteError:
        pass
    try:
        run.step("fails", boom, **kw)
    except RuntimeError:
        pass
    run.model_call("model-" + S, {"q": every, S: 1}, lambda: {"a": 1}, key="mk-" + S,
                   text=lambda r: "answer " + every)
    run.send("sink", "msg " + both, key="send-" + S)
    run.verify("check " + S, ok=True, output="out " + every)
    subprocess.run([os.environ["CTL"], "send", "sink", "ctl " + every], check=True)
    run.step("pay", lambda: "paid", args={"memo": both})  # a person approves it
    run.complete(summary="done " + every)
"""

CONFIG = """snapshot_every = 10
{web}
[otel]
endpoint = "http://{otel}/v1/traces"
[[notify]]
name = "file"
url = "jsonl://notices.jsonl"
events = ["approval.requested", "approval.granted", "message.received", "completed", "blocked"]
"""

secret_s = st.text(string.ascii_letters + string.digits, min_size=20, max_size=40).map(
    lambda t: "sk-" + t
)
# any text but what an environment variable or a file's last line cannot carry
secret_l = st.text(
    st.characters(codec="utf-8", categories=("L", "N", "P", "S")), min_size=12, max_size=30
).map(lambda t: "lit" + t)


def crafted_bundle(folder: Path, secret: str) -> Path:
    """A bundle made elsewhere (the library, no masking) whose own spec masks
    ``secret``, which its events and artifacts hold in the clear."""
    store = FileStore(folder / "craft")
    spec = f'name = "crafted"\nredact = ["{PATTERN}"]\n'

    async def go() -> None:
        await (await store.create("crafted", spec=spec)).close()
        journal = await Journal.open(store, "crafted")
        await journal.append(SessionCreated(name="crafted", goal=f"goal {secret}"))
        await journal.append(ToolIntent(call="c1", tool="t", args={secret: secret}))
        await journal.append(MessageReceived(sender="x", text=secret))
        await journal.close()

    arun(go())
    out = folder / "crafted.bundle"
    export_session(store, "crafted", out)
    return out


def _views(d: Daemon, client: Client, name: str, out: Path) -> dict[str, bytes]:
    """What the daemon shows of ``name``: sessionctl, the console, /metrics, exports."""
    shown: dict[str, bytes] = {}
    for args in (
        ("log", name),
        ("show", name),
        ("ps",),
        ("replay", name, "--view", "messages"),
        ("log", "sink"),
        ("notify",),
    ):
        shown[" ".join(args)] = d.ctl("--json", *args, check=True).stdout.encode()
    d.ctl("trace", "export", name, "-o", str(out / "trace.json"), check=True)
    d.ctl("export", name, "-o", str(out / "bundle"), check=True)
    shown["trace export"] = (out / "trace.json").read_bytes()
    shown["bundle export"] = (out / "bundle").read_bytes()
    for path in (f"/s/{name}", f"/api/s/{name}/events", f"/api/s/{name}/messages", "/metrics"):
        page = client.get(path)
        assert page.status == 200, (path, page)
        shown[path] = page.body
    return shown


class Campaign:
    """One daemon, one example after another; what each wrote is scanned at once."""

    def __init__(self, d: Daemon, otel: Receiver) -> None:
        self.d, self.otel = d, otel
        self.client = logged_in(d)
        self.secrets: list[str] = []
        self.n = 0
        d.ctl("create", str(d.write_spec("sink", SINK.format(root=d.root))), check=True)

    def example(self, s: str, lit: str) -> None:
        d = self.d
        self.n += 1
        name = f"p{self.n}"
        self.secrets += [s, lit]
        ws = short_dir()
        # in its workspace: a run sees no other session's (the sink's is d.root)
        (ws / "program.py").write_text(PROGRAM)
        (ws / "secret.txt").write_text(s)
        (ws / "lit.txt").write_text(lit)
        spec = SPEC.format(
            name=name,
            pattern=PATTERN,
            python=sys.executable,
            ws=ws,
            repo=REPO,
            ctl=SESSIONCTL,
        )
        d.ctl("create", str(d.write_spec(name, spec)), check=True)
        d.ctl("activate", name, check=True)
        wait_event(d, name, "approval.requested", match=lambda r: r["data"]["tool"] == "pay")
        # a person: a message whose text and sender hold both, then the console's
        # approve with a note that holds them
        d.ctl("send", name, f"cli {s} {lit}", "--from", f"person-{s}", check=True)
        answered = self.client.act(f"/api/s/{name}/approve", {"note": f"ok {s} {lit}"})
        assert answered.status == 200, answered.body
        done = wait_event(
            d, name, "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        assert done["data"]["outcome"] == "completed", d.json("log", name)
        token = next(r for r in d.json("log", name, "--type", "run.started"))["data"]["run"]
        assert token  # the runs happened (their tokens are masked by the program's output)
        shown = _views(d, self.client, name, ws)
        found = leaks(d, [s, lit], {**shown, **self._spans()})
        assert not found, f"a secret was written: {found}"
        # the secrets went through: masked where they came
        assert b"[REDACTED]" in shown[f"log {name}"]
        assert "redacted." in shown[f"log {name}"].decode()
        # an import of a bundle made elsewhere that holds the secret: refused
        imported = d.ctl("import", str(crafted_bundle(ws, s)), "--as", f"imp{self.n}")
        assert not leaks(d, [s]), "an import stored the secret"
        assert imported.returncode != 0
        assert "redact patterns mask" in imported.stderr + imported.stdout, imported

    def _spans(self) -> dict[str, bytes]:
        return {f"otlp {i}": r.body for i, r in enumerate(self.otel.requests)}


def test_a_secret_through_every_input_is_written_nowhere() -> None:
    with receiving() as otel, running(CONFIG.format(web=WEB, otel=otel.url)) as d:
        campaign = Campaign(d, otel)

        @settings(
            max_examples=4,
            deadline=None,
            database=None,
            # each example is a session of the one daemon: no shrinking (the
            # failure names the secret, where it was found, and in which form)
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(s=secret_s, lit=secret_l)
        def through_every_input(s: str, lit: str) -> None:
            campaign.example(s, lit)

        through_every_input()
        spans: dict[str, Any] = campaign._spans()
        assert spans, "no trace was exported"
        files = assert_written_nowhere(d, campaign.secrets, spans)
        assert any("/snapshots/" in p for p in files), sorted(files)
        assert any("/artifacts/" in p for p in files)
        assert "notices.jsonl" in files
        assert written(d)["notices.jsonl"]
