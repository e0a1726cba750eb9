"""Retention through the real daemon (docs/design.md section 6): ``[retention]``,
``sessionctl gc``, the ``gc.collected`` events, fsck after a gc, a kill -9 in the
middle of one, and model contexts stored as chunks shared between calls.

The sessions here run ``programs/chatter.py``: an agent conversation whose every
model call re-sends the whole history, as agents do.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiond.log.chunks import CHUNKED_MEDIA, read_context
from sessiond.log.store.fileartifacts import FileArtifacts
from tests.e2e.harness import SESSIOND, Daemon, short_dir, wait_event

CHATTER = Path(__file__).parent / "programs" / "chatter.py"
ROOT = Path(__file__).parents[2]
SPEC = """name = "{name}"
goal = "talk"
[run]
kind = "sdk"
exec = ["{python}", "{chatter}"]
cwd = "."
env = {{ PYTHONPATH = "{root}", CHAT_CALLS = "{calls}", CHAT_BYTES = "{size}"{env} }}
[policy]
ask = ["publish"]
"""
HOUR = 3600


def _chatter() -> Any:
    spec = importlib.util.spec_from_file_location("chatter", CHATTER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make(d: Daemon, name: str, calls: int = 6, size: int = 1000, env: str = "") -> None:
    text = SPEC.format(
        name=name, python=sys.executable, chatter=CHATTER, root=ROOT, calls=calls, size=size,
        env=env,
    )  # fmt: skip
    d.ctl("create", str(d.write_spec(name, text)), check=True)


def to(state: str) -> Any:
    return lambda r: r["data"]["to"] == state


def talk(d: Daemon, name: str, calls: int = 6, size: int = 1000) -> None:
    """A conversation that runs to its end (the session terminates completed)."""
    make(d, name, calls, size)
    d.ctl("activate", name, check=True)
    done = wait_event(d, name, "lifecycle.changed", match=to("terminated"))
    assert done["data"]["outcome"] == "completed"


def artifacts_dir(d: Daemon, name: str) -> Path:
    return d.state_dir / "sessions" / name / "artifacts"


def stored(d: Daemon, name: str) -> dict[str, int]:
    folder = artifacts_dir(d, name)
    return {f"sha256:{p.name}": p.stat().st_size for p in folder.iterdir()}


def age(d: Daemon, name: str, seconds: float) -> None:
    """Make every artifact file of ``name`` look ``seconds`` old (a gc leaves fresh
    files of a live session alone: an event naming one may be on its way)."""
    for path in artifacts_dir(d, name).iterdir():
        st = path.stat()
        os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


def fsck(d: Daemon) -> dict[str, Any]:
    done = subprocess.run(
        [SESSIOND, "fsck", "--state-dir", str(d.state_dir), "--json"],
        capture_output=True,
        check=False,
        timeout=120,
    )
    report: dict[str, Any] = orjson.loads(done.stdout)
    assert done.returncode == (0 if report["ok"] else 1)
    return report


def configure(d: Daemon, retention: str, top: str = "") -> None:
    """Replace the daemon's [retention] (and add ``top`` keys; the harness's stay)."""
    text = d.config.read_text().split("[retention]")[0]
    d.config.write_text(text + top + "[retention]\n" + retention)


@pytest.fixture
def d() -> Iterator[Daemon]:
    daemon = Daemon(short_dir()).start()
    try:
        yield daemon
    finally:
        try:
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.stop()
        finally:
            shutil.rmtree(daemon.root, ignore_errors=True)


def test_a_long_conversation_stores_each_message_about_once_not_once_a_call(d: Daemon) -> None:
    calls, size = 40, 2000
    talk(d, "talk", calls, size)
    requested = d.json("log", "talk", "--type", "model.requested")
    assert len(requested) == calls
    # Stored whole, call n keeps n messages again: about calls²/2 messages in all.
    whole = sum(len(orjson.dumps(_chatter().request(n, size))) for n in range(calls))
    total = sum(stored(d, "talk").values())
    assert total < whole / 5, f"{total} bytes stored for {whole} bytes of contexts"
    # Each context reads back as exactly the bytes the program sent.
    files = FileArtifacts(artifacts_dir(d, "talk"))
    chunked = 0
    for n, record in enumerate(requested):
        ref = record["data"]["context"]
        chunked += ref["media_type"] == CHUNKED_MEDIA
        assert read_context(files, ref) == orjson.dumps(_chatter().request(n, size))
    assert chunked > calls // 2  # the short first contexts are stored whole
    assert fsck(d)["ok"]


def test_gc_removes_a_terminated_sessions_evidence_after_its_age_and_records_it(
    d: Daemon,
) -> None:
    configure(d, 'terminated = "1d"\n')
    d.ctl("reload", check=True)
    talk(d, "old")
    before = stored(d, "old")
    # Terminated just now: not old enough.
    nothing = d.json("gc")
    assert (nothing["artifacts"], nothing["sessions"]) == (0, [])
    # Two days later (the daemon's clock: event times are what count).
    d.stop()
    configure(d, 'terminated = "1d"\n', top=f"clock_offset = {2 * 86400}\n")
    d.start()
    dry = d.json("gc", "--dry-run")
    assert dry["dry_run"] is True
    assert dry["artifacts"] > 0
    assert stored(d, "old") == before  # a dry run removes nothing...
    assert d.json("log", "old", "--type", "gc.collected") == []  # ...and records nothing
    done = d.json("gc")
    [session] = done["sessions"]
    assert session["name"] == "old"
    gone = {a["ref"] for a in session["artifacts"]}
    assert gone == {a["ref"] for a in dry["sessions"][0]["artifacts"]}
    assert {a["rule"] for a in session["artifacts"]} == {"terminated"}
    assert done["bytes"] == sum(before[r] for r in gone)
    after = stored(d, "old")
    assert gone.isdisjoint(after)
    # What show and a fork need stays: the last run's output.
    last_run = d.json("show", "old")["last_run"]
    for key in ("stdout", "stderr"):
        if last_run.get(key):
            assert last_run[key]["ref"] in after
    [event] = d.json("log", "old", "--type", "gc.collected")
    assert {a["artifact"] for a in event["data"]["artifacts"]} == gone
    assert event["data"]["bytes"] == done["bytes"]
    assert event["data"]["uid"] == os.getuid()
    # A second gc finds nothing more; fork and export still work without the evidence.
    assert d.json("gc")["artifacts"] == 0
    d.ctl("fork", "old", "--as", "young", check=True)
    bundle = d.root / "old.bundle"
    d.ctl("export", "old", "-o", str(bundle), check=True)
    d.ctl("import", str(bundle), "--as", "back", check=True)
    d.stop()
    report = fsck(d)
    assert report["ok"], report["problems"]
    assert report["collected"] >= len(gone)  # reported as removed by gc, not as missing


def test_gc_never_touches_what_a_live_sessions_gate_and_turn_need(d: Daemon) -> None:
    configure(d, 'keep_artifacts = 0\nunreferenced = "1s"\nsnapshots = 1\n')
    d.ctl("reload", check=True)
    make(d, "live", calls=5, size=3000, env=', CHAT_BIG_STEP = "1", CHAT_ASK = "1"')
    d.ctl("activate", "live", check=True)
    wait_event(d, "live", "lifecycle.changed", match=to("blocked"))  # publish waits for a person
    age(d, "live", 2 * HOUR)
    # A stray file no event names (a crash between storing and recording leaves one).
    stray = artifacts_dir(d, "live") / ("0" * 64)
    stray.write_bytes(b"left by a crash")
    os.utime(stray, (1, 1))
    done = d.json("gc")
    [session] = done["sessions"]
    rules = {a["rule"] for a in session["artifacts"]}
    assert {"beyond-keep", "unreferenced"} <= rules  # old contexts and the stray went
    assert not stray.exists()
    # The gate is still ok, and approving continues the same turn: every finished
    # step (the big result, the model responses) is replayed from its artifact.
    gate = d.ctl("gate", "live").stdout
    assert "ok   artifacts intact" in gate, gate
    failing = [line for line in gate.splitlines() if line.startswith("FAIL")]
    assert failing == [line for line in failing if "waits for approval" in line], gate
    d.ctl("approve", "live", check=True)
    finished = wait_event(d, "live", "lifecycle.changed", match=to("terminated"))
    assert finished["data"]["outcome"] == "completed"
    counts = {n: len((d.root / f"{n}.count").read_text().split()) for n in ("big", "model")}
    assert counts == {"big": 1, "model": 5}
    d.stop()
    report = fsck(d)
    assert report["ok"], report["problems"]


def test_a_kill9_in_the_middle_of_a_gc_leaves_a_store_fsck_accepts_and_the_next_gc_ends_it(
    d: Daemon,
) -> None:
    talk(d, "talk", calls=20, size=1500)
    count = len(stored(d, "talk"))
    configure(d, 'terminated = "0s"\nfault_kill_after = 3\n')
    d.stop()
    d.start()
    cut = d.ctl("gc")
    assert cut.returncode == 3, cut.stdout + cut.stderr  # the daemon died under it
    assert d.proc is not None
    assert d.proc.wait(30) == -signal.SIGKILL
    left = stored(d, "talk")
    assert count - 3 == len(left)  # three files went, then the kill
    report = fsck(d)
    assert report["ok"], report["problems"]
    configure(d, 'terminated = "0s"\n')
    d.start()
    done = d.json("gc")
    assert done["artifacts"] > 0
    events = d.json("log", "talk", "--type", "gc.collected")
    assert len(events) == 2  # the cut-off gc's record, and the one that finished it
    recorded = {a["artifact"] for e in events for a in e["data"]["artifacts"]}
    assert set(left) - set(stored(d, "talk")) <= recorded
    d.stop()
    report = fsck(d)
    assert report["ok"], report["problems"]


def test_gc_with_no_retention_rules_removes_nothing_and_says_why(d: Daemon) -> None:
    talk(d, "talk", calls=2)
    before = stored(d, "talk")
    out = d.ctl("gc", check=True).stdout
    assert "no [retention] rule" in out
    assert stored(d, "talk") == before


def test_the_daemon_collects_every_interval_once_reload_sets_one(d: Daemon) -> None:
    talk(d, "talk", calls=2)
    configure(d, 'terminated = "0s"\ninterval = "1s"\n')
    d.ctl("reload", check=True)
    event = wait_event(d, "talk", "gc.collected")
    assert event["data"]["trigger"] == "interval"
    assert event["data"]["uid"] is None  # nobody asked: the daemon did
    assert event["data"]["artifacts"]


def test_a_gc_reads_only_what_was_appended_since_the_last_and_plans_as_a_full_read(
    d: Daemon,
) -> None:
    configure(d, "keep_artifacts = 1\n")
    d.ctl("reload", check=True)
    make(d, "live", calls=4, size=3000, env=', CHAT_ASK = "1"')
    d.ctl("activate", "live", check=True)
    wait_event(d, "live", "lifecycle.changed", match=to("blocked"))  # publish waits
    first = d.json("gc")
    logged = len(d.json("log", "live"))
    assert first["events_read"] >= logged - 1  # the first gc reads the log whole
    # Nothing appended since but the gc's own record: an idle session costs no read.
    assert d.json("gc", "--dry-run")["events_read"] <= 1
    d.ctl("approve", "live", check=True)
    wait_event(d, "live", "lifecycle.changed", match=to("terminated"))
    age(d, "live", 2 * HOUR)
    grown = len(d.json("log", "live"))
    kept_on = d.json("gc", "--dry-run")
    assert 0 < kept_on["events_read"] <= grown - logged + 1  # only the new part
    # A daemon that starts afresh reads every log whole: the same plan.
    d.stop()
    d.start()
    fresh = d.json("gc", "--dry-run")
    assert fresh["events_read"] >= grown - 1
    assert kept_on["sessions"] == fresh["sessions"]
    assert fresh["artifacts"] > 0  # the run after the approval made the old newest old
