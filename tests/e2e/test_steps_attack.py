"""Attacks on durable steps (docs/design.md section 8), through the real daemon.

Each test tries to make the daemon break a promise of section 8: run a finished
step twice in one turn, call a model twice for one model step, let a program
approve its own call, lose the turn's wake cause, loop, or fall over on bad
``sdk.*`` params. Every run is a new process, so work is counted in files
(``<name>.count``, one line per execution).

Tests marked ``BUG:`` in their docstring failed on the code they were written
against; the report that came with them says what the bug is. The attacks that
need no real process run in process (tests/inproc/test_step_replay.py).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for

ROOT = Path(__file__).parents[2]
POLICY = 'allow = ["pay", "charge", "ship"]\nask = ["edit_file"]'

# Helpers every program starts with: count work in files, hold at a point until the
# test lets go (`hold("x")` writes x.reached and waits for x).
PRELUDE = """import os, sys, time
from pathlib import Path
from sessiond.sdk import connect, connect_async, Denied, ApprovalPending, StopRun
def count(name, word="x"):
    with open(name + ".count", "a") as f:
        f.write(word + "\\n")
    return word
def n(name):
    p = Path(name + ".count")
    return len(p.read_text().splitlines()) if p.exists() else 0
def hold(name):
    Path(name + ".reached").write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not Path(name).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
SAFE = dict(side_effect="read", idempotency="safe", resume="replay-from-event")
"""


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


def program(
    d: Daemon,
    body: str,
    *,
    name: str = "agent",
    policy: str = "",
    run: str = "",
    env: str = "",
    extra: str = "",
) -> None:
    """Create session ``name`` whose sdk program is PRELUDE + ``body``."""
    prog = d.root / f"{name}.py"
    prog.write_text(PRELUDE + body)
    spec = (
        f'name = "{name}"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{prog}"]\n'
        f'cwd = "."\nenv = {{ PYTHONPATH = "{ROOT}"{env} }}\n{run}\n[policy]\n{policy}\n{extra}'
    )
    d.ctl("create", str(d.write_spec(name, spec)), check=True)


def lines(d: Daemon, name: str) -> int:
    path = d.root / f"{name}.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def to(state: str) -> Any:
    return lambda r: r["data"]["to"] == state


def seq(d: Daemon, name: str = "agent") -> int:
    return int(d.json("show", name)["seq"])


def runs(d: Daemon, name: str = "agent") -> list[dict[str, Any]]:
    return list(d.json("log", name, "--type", "run.started"))


def settled(d: Daemon, name: str = "agent") -> str:
    """Wait until the session waits for a person or is done (blocked, terminated,
    suspended) and return that state (sleeping between retries is not rest)."""

    def rest() -> str | None:
        state = str(d.json("show", name)["state"])
        return state if state in ("blocked", "terminated", "suspended") else None

    return str(wait_for(rest, timeout=60, what=f"{name} to rest"))


# --- 1. a finished step never runs twice in its turn --------------------------------


MODEL_CRASH = """
def ask():
    count("model")
    if not Path("crashed").exists():
        Path("crashed").write_text("1")
        os._exit(3)                     # the program dies with the request sent
    return {"say": "hi", "usage": {"input_tokens": 5, "output_tokens": 1}}
with connect() as run:
    run.step("pay", lambda: count("pay"))
    run.model_call("m-1", {"q": "hi"}, ask)
    run.model_call("m-1", {"q": "again"}, lambda: count("model2") and {"say": "ok"})
    run.complete()
"""


def test_a_model_step_cut_off_by_a_crash_is_asked_again_and_the_turn_goes_on(d: Daemon) -> None:
    """BUG (fixed on this branch).
    A model step whose program died before its response stays ``started`` in
    the turn's step table (nothing closes it: the gate only looks at tool calls), and
    every later run that reaches it is refused "already under way in this run". The
    retries burn out on that refusal and the turn can never get past the step; only
    ``--discard`` ends it. A model call changes nothing in the world: it should be
    asked again (docs/design.md section 8, steps.py: "simply asked again")."""
    program(d, MODEL_CRASH, policy=POLICY, run="retries = 2")
    d.ctl("activate", "agent", check=True)
    state = settled(d)
    shown = d.json("show", "agent")
    assert lines(d, "pay") == 1
    assert state == "terminated", shown["reason"]
    assert lines(d, "model") == 2  # the cut-off request once more, nothing else twice
    assert lines(d, "model2") == 1


EXIT_IN_STEP = """
def look():
    count("look")
    os._exit(0)                         # exit 0 inside the step: it never finishes
with connect() as run:
    run.step("look", look, **SAFE)
    run.complete()
"""


def test_exit_0_inside_a_safe_step_does_not_run_the_session_forever(d: Daemon) -> None:
    """BUG (fixed on this branch).
    A run that exits 0 with a step left started does not end its turn, and
    ``after_run`` wakes the session again at once ('retry') without counting it as a
    failure (exit 0 resets ``failures_in_a_row``) or backing off. The gate closes a
    safe step as interrupted, the next run starts it again, exits 0 again: the
    session runs again and again with no bound, as fast as it can spawn."""
    program(d, EXIT_IN_STEP, run="retries = 2")
    d.ctl("activate", "agent", check=True)

    def stuck_or_looping() -> str | None:
        if lines(d, "look") >= 8:
            return "looping"
        state = str(d.json("show", "agent")["state"])
        return state if state in ("blocked", "terminated", "suspended") else None

    outcome = wait_for(stuck_or_looping, timeout=60, what="the session to rest or loop")
    assert outcome != "looping", f"{lines(d, 'look')} runs of one turn and counting"
    assert outcome == "blocked"
    assert lines(d, "look") <= 3  # the run and its two retries at most


# --- 6. bad sdk.step / sdk.step_done / sdk.send params ------------------------------

BAD_PARAMS = """
import json, socket
from sessiond.wire import RemoteError
out = {}
def attempt(label, method, **params):
    try:
        out[label] = ["ok", run._call(method, **params)]
    except RemoteError as exc:
        out[label] = ["refused", exc.code, exc.message[:300]]
def raw(label, line):
    # a hand-made frame on a connection of its own: what no SDK would send
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["SESSIOND_SOCKET"])
    s.sendall(line + b"\\n")
    buf = b""
    while b"\\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    out[label] = buf.decode(errors="replace")[:300]
tok = os.environ["SESSIOND_TOKEN"]
def frame(method, params):
    return json.dumps({"id": 1, "method": method, "params": {"token": tok, **params}}).encode()
with connect() as run:
    step = dict(kind="tool", name="pay", args={}, risk={}, writes=[])
    for label, ordinal in (("huge", 10**12), ("zero", 0), ("negative", -1), ("float", 1.5)):
        attempt(label, "sdk.step", ordinal=ordinal, **step)
    # a key is a name in the step table, never a path: accepted, and finished
    dots = run._call("sdk.step", ordinal=1, key="../../etc", **step)
    attempt("key-dots", "sdk.step_done", call=dots["call"], status="ok", result=None)
    for label, key in (("long", "k" * 5000), ("nl", "a\\nb"),
                       ("empty", ""), ("nul", "a\\x00b"), ("dict", {"a": 1})):
        attempt("key-" + label, "sdk.step", ordinal=1, key=key, **step)
    attempt("args-list", "sdk.step", kind="tool", name="pay", ordinal=1, args=[1, 2])
    attempt("kind-bad", "sdk.step", kind="shell", name="pay", ordinal=1)
    attempt("risk-bad", "sdk.step", ordinal=1, kind="tool", name="pay", risk={"resume": "x"})
    attempt("done-unknown", "sdk.step_done", call="r9.9", status="ok", result=1)
    attempt("done-model-id", "sdk.step_done", call="r1.m1", status="ok", result=1)
    # a real step, answered with what is not a result
    first = run._call("sdk.step", ordinal=1, **step)
    call = first["call"]
    attempt("done-b64-bad", "sdk.step_done", call=call, status="ok", result_b64="%%%")
    raw("done-deep", frame("sdk.step_done", {"call": call, "result": json.loads(
        "[" * 5000 + "]" * 5000)}) if False else
        b'{"id":1,"method":"sdk.step_done","params":{"token":"' + tok.encode() +
        b'","call":"' + call.encode() + b'","result":' + b"[" * 5000 + b"]" * 5000 + b"}}")
    raw("not-json", b"{this is not json")
    raw("binary", bytes(range(256)).replace(b"\\n", b""))
    ref = {"ref": "sha256:" + "0" * 64, "size": 5}
    attempt("done-ref", "sdk.step_done", call=call, status="ok", result=ref)
    attempt("done-twice", "sdk.step_done", call=call, status="ok", result={"again": 1})
    attempt("done-error-after-ok", "sdk.step_done", call=call, status="error", error="x")
    attempt("send-self", "sdk.send", to=os.environ["SESSIOND_SESSION"], text="hi", ordinal=2)
    attempt("send-nobody", "sdk.send", to="no-such-session", text="hi", ordinal=2)
    attempt("send-huge-ordinal", "sdk.send", to="other", text="hi", ordinal=10**12)
    big = run._call("sdk.step", ordinal=4, **{**step, "name": "pay"})["call"]
    raw("done-bigint", b'{"id":1,"method":"sdk.step_done","params":{"token":"' + tok.encode()
        + b'","call":"' + big.encode() + b'","result":' + str(2**80).encode() + b"}}")
    # a start behind an end (after) that is not a call, or not one finished ok
    for label, after in (("int", 5), ("empty", ""), ("long", "c" * 301), ("dict", {"a": 1}),
                         ("bogus", "r9.9")):
        attempt("after-" + label, "sdk.step", ordinal=5, after=after, **step)
    # still a working run: the next step is taken and finished normally
    again = run._call("sdk.step", ordinal=3, **{**step, "name": "pay"})
    attempt("after", "sdk.step_done", call=again["call"], status="ok", result="fine")
    Path("out.json").write_text(json.dumps(out))
    run.sleep()
"""


def test_bad_step_params_get_clear_refusals_and_the_daemon_stays_up(d: Daemon) -> None:
    """Malformed ``sdk.*`` params (huge or negative ordinals, odd keys, results that
    are not JSON, bytes that are not base64, a ``{"ref": ...}`` result, a second
    ``step_done``, a call that is not under way) are refused, each saying what was
    wrong, and neither the daemon nor the run is harmed."""
    program(d, BAD_PARAMS, policy='allow = ["pay"]')
    program(d, "with connect() as run:\n    run.sleep()\n", name="other")
    d.ctl("activate", "agent", check=True)
    state = wait_for(
        lambda: (
            d.json("show", "agent")["state"] in ("sleeping", "blocked", "terminated")
            and d.json("show", "agent")["last_run"] is not None
        ),
        timeout=60,
        what="the run to end",
    )
    assert state
    assert d.proc is not None
    assert d.proc.poll() is None  # the daemon is up
    assert d.ctl("ping").returncode == 0
    shown = d.json("show", "agent")
    assert shown["state"] == "sleeping", shown["reason"]
    out = orjson.loads((d.root / "out.json").read_bytes())
    for label in ("huge", "zero", "negative", "float"):
        assert out[label][0] == "refused", (label, out[label])
        assert "ordinal" in out[label][2], out[label]
    assert out["key-dots"][0] == "ok"
    for label in ("long", "nl", "empty", "nul", "dict"):
        assert out["key-" + label][0] == "refused", (label, out["key-" + label])
        assert "key" in out["key-" + label][2], out["key-" + label]
    for label in ("args-list", "kind-bad", "risk-bad"):
        assert out[label][0] == "refused", (label, out[label])
    # BUG (fixed with this test): a bad risk contract was an "internal error:
    # ValidationError" instead of bad input naming the field
    assert out["risk-bad"][1] == "invalid_input", out["risk-bad"]
    assert "resume" in out["risk-bad"][2]
    assert out["done-unknown"][0] == "refused"
    assert "not under way" in out["done-unknown"][2]
    assert out["done-model-id"][0] == "refused"
    assert out["done-b64-bad"][0] == "refused"
    assert "base64" in out["done-b64-bad"][2]
    for label in ("done-deep", "not-json", "binary"):
        assert '"error"' in out[label] or out[label] == "", (label, out[label])
    # a result shaped like an artifact reference is a plain result, kept inline
    assert out["done-ref"][0] == "ok", out["done-ref"]
    assert out["done-twice"][0] == "refused"
    assert out["done-error-after-ok"][0] == "refused"
    assert out["send-self"][0] == "refused"
    assert out["send-nobody"][0] == "refused"
    assert out["send-huge-ordinal"][0] == "refused"
    assert out["after"][0] == "ok"
    for label in ("int", "empty", "long", "dict"):
        assert out["after-" + label][:2] == ["refused", "invalid_input"], out["after-" + label]
        assert "after" in out["after-" + label][2], out["after-" + label]
    # an end never recorded: refused as such, not as bad input
    assert out["after-bogus"][:2] == ["refused", "refused"], out["after-bogus"]
    assert "not finished ok" in out["after-bogus"][2], out["after-bogus"]
    intents = d.json("log", "agent", "--type", "tool.intent")
    assert 5 not in [r["data"]["ordinal"] for r in intents]  # none of them started
    # a number past 64 bits comes in as JSON's float (the SDK itself refuses it)
    assert '"ok":true' in out["done-bigint"]
    finished = [r["data"] for r in d.json("log", "agent", "--type", "tool.finished")]
    # the key step, the ref-shaped result, the big number, "after" (a send to no
    # session is refused before it is a step: it records nothing)
    assert [f["status"] for f in finished] == ["ok", "ok", "ok", "ok"]
    assert out["send-nobody"][1] == "no_such_session"
    assert finished[1]["result"] == {"ref": "sha256:" + "0" * 64, "size": 5}
    assert finished[1]["result_ref"] is None
    # the session's log still replays and exports with that result in it
    assert d.ctl("replay", "agent").returncode == 0
    bundle = d.root / "agent.bundle"
    exported = d.ctl("export", "agent", "-o", str(bundle))
    assert exported.returncode == 0, exported.stderr


# --- 3. a program never approves its own call ---------------------------------------

SELF_APPROVE = """
import json, subprocess, socket
from sessiond.wire import Connection, RemoteError
tried = {}
def ctl(label, *args, socket_path=None):
    env = dict(os.environ)
    if socket_path:
        env["SESSIOND_SOCKET"] = socket_path
    done = subprocess.run(["sessionctl", *args], env=env, capture_output=True, text=True)
    tried[label] = [done.returncode, done.stderr[:300]]
with connect() as run:
    run.step("pay", lambda: count("pay"))
    try:
        run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    except ApprovalPending:
        me = os.environ["SESSIOND_SESSION"]
        ctl("endpoint-approve", "approve", me)
        ctl("endpoint-resolve", "resolve", me, "--accept")
        ctl("endpoint-deny", "deny", me)
        # the control socket itself, whose path the test handed over
        ctl("control-approve", "approve", me, socket_path=os.environ["CONTROL"])
        # a double-forked, setsid grandchild tries too
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                ctl("grandchild-approve", "approve", me, socket_path=os.environ["CONTROL"])
                Path("grandchild.json").write_text(json.dumps(tried))
                os._exit(0)
            os._exit(0)
        os.waitpid(pid, 0)
        # the raw method on the endpoint, with the token, no sessionctl
        try:
            Connection(Path(os.environ["SESSIOND_SOCKET"])).call(
                "approve", {"name": me, "token": os.environ["SESSIOND_TOKEN"], "by": "root"})
            tried["raw-approve"] = [0, ""]
        except RemoteError as exc:
            tried["raw-approve"] = [exc.exit_code, exc.message[:300]]
        while not Path("grandchild.json").exists():
            time.sleep(0.02)
        tried.update(json.loads(Path("grandchild.json").read_text()))
        Path("tried.json").write_text(json.dumps(tried))
        raise
    run.complete()
"""


def test_a_program_cannot_approve_its_own_call_by_any_road(d: Daemon) -> None:
    """The program (and a setsid grandchild of it) tries approve, deny and resolve on
    the program endpoint, on the control socket, and as a raw request: all refused,
    and the approval waits for a person."""
    program(
        d,
        SELF_APPROVE,
        policy=POLICY,
        run='grants = ["send"]',
        env=f', CONTROL = "{d.socket}"',
    )
    d.ctl("activate", "agent", check=True)
    blocked = wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    assert "approval pending for edit_file" in blocked["data"]["reason"]
    # The session is blocked once the approval is asked for; the program tries its
    # roads after that and writes what it got before its run ends.
    wait_event(d, "agent", "run.finished")
    tried = orjson.loads((d.root / "tried.json").read_bytes())
    for label in (
        "endpoint-approve",
        "endpoint-resolve",
        "endpoint-deny",
        "control-approve",
        "grandchild-approve",
        "raw-approve",
    ):
        assert tried[label][0] != 0, (label, tried[label])
    shown = d.json("show", "agent")
    assert shown["state"] == "blocked"
    assert [a["tool"] for a in shown["pending_approvals"]] == ["edit_file"]
    assert d.json("log", "agent", "--type", "approval.granted") == []
    assert d.json("log", "agent", "--type", "recovery.resolved") == []
    assert lines(d, "edits") == 0
    d.ctl("approve", "agent", check=True)  # a person
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "pay"), lines(d, "edits")) == (1, 1)
    granted = d.json("log", "agent", "--type", "approval.granted")
    assert len(granted) == 1
    assert granted[0]["data"]["channel"] == "cli"


# --- 1. threads, async, interrupts, messages, crashes mid-turn ----------------------

THREADS = """
import threading
with connect() as run:
    results = {}
    def worker(k):
        results[k] = run.step("charge", lambda: count("charge-" + k) and {"k": run.key()},
                              args={"who": k}, key="charge-" + k)
    threads = [threading.Thread(target=worker, args=(k,)) for k in ("a", "b", "c")]
    # started in another order in every run: keys, not call order, place them
    order = threads if not Path("ran-once").exists() else threads[::-1]
    Path("ran-once").write_text("1")
    for t in order:
        t.start()
    for t in order:
        t.join()
    Path("keys.seen").open("a").write(json.dumps(results, sort_keys=True) + "\\n")
    m = run.model_call("m-1", {"q": 1}, lambda: count("model") and {"say": "go"})
    if not Path("hold-released").exists():
        hold("hold")                       # the test kills the daemon here (run 1)
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
""".replace("import threading", "import threading, json")


def test_keyed_steps_from_threads_survive_a_kill9_and_an_approval(d: Daemon) -> None:
    """Three keyed steps from threads and a model step, then the daemon is killed -9,
    then an approval: every run replays them, none runs twice, the keys stay put."""
    program(d, THREADS, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_for((d.root / "hold.reached").exists, what="the steps to finish")
    d.kill9()
    (d.root / "hold-released").write_text("")
    (d.root / "hold").write_text("")
    d.start()
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    counts = [lines(d, f"charge-{k}") for k in "abc"]
    assert counts == [1, 1, 1]
    assert (lines(d, "model"), lines(d, "edits")) == (1, 1)
    seen = (d.root / "keys.seen").read_text().splitlines()
    assert len(seen) == 3  # the first run, the one after the restart, after the approval
    assert len(set(seen)) == 1  # the same results, with the same keys, every run
    assert [r["data"]["turn"] for r in runs(d)] == [1, 1, 1]


ASYNC = """
import asyncio
async def main():
    async with connect_async() as run:
        async def slow(k):
            count("step-" + k)
            await asyncio.sleep(0)
            return k
        a = run.step("fetch", lambda: slow("a"), args={"k": "a"}, **SAFE)   # ordinal 1
        b = run.step("fetch", lambda: slow("b"), args={"k": "b"}, **SAFE)   # ordinal 2
        got = await asyncio.gather(b, a)                       # awaited in another order
        Path("async.seen").open("a").write(",".join(got) + "\\n")
        m = run.model_call("m-1", {"q": got}, lambda: count("model") and {"ok": 1})
        await m
        await run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
        await run.complete()
asyncio.run(main())
"""


def test_async_steps_replay_after_an_approval_and_run_once(d: Daemon) -> None:
    program(d, ASYNC, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "step-a"), lines(d, "step-b"), lines(d, "model"), lines(d, "edits")) == (
        1,
        1,
        1,
        1,
    )
    assert (d.root / "async.seen").read_text() == "b,a\nb,a\n"


STOP_MID_STEP = """
import json
with connect() as run:
    ctx = run.context()
    seen = [ctx["turn"], [w["trigger"] for w in ctx["wakes"]], len(ctx["messages"])]
    Path("context.seen").open("a").write(json.dumps(seen) + "\\n")
    def pay():
        count("pay")
        if n("pay") == 1:                  # the test stops the session while it works:
            Path("hold.reached").write_text("1")   # a slow tool that sees the stop
            while not run.stop_requested:          # and finishes within the grace
                time.sleep(0.01)
        return {"paid": 1}
    run.step("pay", pay)
    run.step("ship", lambda: count("ship"))
    run.sleep()
"""


@pytest.mark.parametrize("how", ["interrupt", "suspend"])
def test_a_stop_in_the_middle_of_a_step_lets_it_finish_and_never_repeats_it(
    d: Daemon, how: str
) -> None:
    """SIGTERM while a step works: the step finishes and is recorded, the next one is
    not started; the session continues the same turn later (activate / resume), with
    the same context, and the finished step is replayed."""
    program(d, STOP_MID_STEP, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_for((d.root / "hold.reached").exists, what="the step to start")
    done = d.ctl(how, "agent")
    assert done.returncode == 0, done.stderr
    rest = "sleeping" if how == "interrupt" else "suspended"
    wait_event(d, "agent", "lifecycle.changed", match=to(rest))
    assert (lines(d, "pay"), lines(d, "ship")) == (1, 0)
    since = seq(d) + 1
    d.ctl("send", "agent", "a message that comes mid-turn", check=True)
    if how == "suspend":
        d.ctl("resume", "agent", check=True)
    d.ctl("activate", "agent", check=True)
    wait_event(
        d,
        "agent",
        "run.finished",
        since=since,
        match=lambda r: r["data"].get("ends_turn") is True,
    )
    assert (lines(d, "pay"), lines(d, "ship")) == (1, 1)
    seen = [orjson.loads(x) for x in (d.root / "context.seen").read_text().splitlines()]
    assert seen[0] == seen[1]  # the same turn, wake cause and context
    assert seen[0][1] == ["manual"]
    assert [r["data"]["turn"] for r in runs(d)] == [1, 1]
    assert settle_sleeping(d) == "sleeping"  # the turn ended: nothing runs again by itself
    # the message is the next turn's: its context has it, and its steps are its own
    since = seq(d) + 1
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "run.finished", since=since)
    assert settle_sleeping(d) == "sleeping"
    seen = [orjson.loads(x) for x in seen_lines(d)]
    assert len(seen) == 3
    assert seen[2][0] == 2
    assert seen[2][2] > seen[0][2]  # the message is in the new turn's context
    assert [r["data"]["turn"] for r in runs(d)] == [1, 1, 2]
    assert (lines(d, "pay"), lines(d, "ship")) == (2, 2)  # once per turn


def seen_lines(d: Daemon) -> list[str]:
    return (d.root / "context.seen").read_text().splitlines()


def settle_sleeping(d: Daemon) -> str:
    """Wait until the last turn's run has finished and the session sleeps."""

    def ended() -> str | None:
        shown = d.json("show", "agent")
        finished = d.json("log", "agent", "--type", "run.finished")
        if shown["state"] != "running" and len(finished) == len(runs(d)):
            return str(shown["state"])
        return None

    return str(wait_for(ended, timeout=60, what="the last run to end"))


MODEL_HOLD = """
def ask():
    count("model")
    if n("model") == 1:
        hold("hold")                       # the test kills the daemon here
    return {"say": "hi", "usage": {"input_tokens": 5, "output_tokens": 1}}
with connect() as run:
    run.step("pay", lambda: count("pay"))
    run.model_call("m-1", {"q": "hi"}, ask)
    run.complete()
"""


def test_a_kill9_during_a_model_call_asks_it_once_more_and_repeats_nothing_finished(
    d: Daemon,
) -> None:
    """BUG (fixed on this branch, the model step fix above): the daemon dies while
    the model works; after the restart the turn continues once, the paid step is
    replayed and the cut-off model request is sent again (it never answered)."""
    program(d, MODEL_HOLD, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_for((d.root / "hold.reached").exists, what="the model call to start")
    d.kill9()
    (d.root / "hold").write_text("")
    d.start()
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert lines(d, "pay") == 1
    assert lines(d, "model") == 2
    responded = d.json("log", "agent", "--type", "model.responded")
    assert len(responded) == 1
    assert d.json("show", "agent")["outcome"] == "completed"


COMPLETE_THEN_CRASH = """
with connect() as run:
    run.step("pay", lambda: count("pay"))
    run.complete(summary="paid")
    count("after-complete")
    os._exit(3)                             # dies after saying it is done
"""


def test_complete_then_a_crash_never_pays_twice_and_does_not_loop(d: Daemon) -> None:
    """A program that says complete() and then crashes: the retries replay the paid
    step; the session comes to rest (it does not run again and again)."""
    program(d, COMPLETE_THEN_CRASH, policy=POLICY, run="retries = 2")
    d.ctl("activate", "agent", check=True)
    state = settled(d)
    assert lines(d, "pay") == 1
    assert lines(d, "after-complete") <= 3
    assert state in ("blocked", "terminated")


TIMEOUT_IN_STEP = """
def pay():
    count("pay")
    if n("pay") == 1:
        hold("hold")                       # never let go: the run's timeout ends it
    return 1
with connect() as run:
    run.step("pay", pay)
    run.step("ship", lambda: count("ship"))
    run.complete()
"""


def test_a_timeout_in_an_unsafe_step_blocks_and_accept_never_reruns_it(d: Daemon) -> None:
    # 5 s: on a loaded machine a 1 s timeout could end a run before its program
    # reached the step at all (then nothing is cut off mid-step to block on)
    program(d, TIMEOUT_IN_STEP, policy=POLICY, run='timeout = "5s"\nretries = 3')
    d.ctl("activate", "agent", check=True)
    blocked = wait_event(d, "agent", "lifecycle.changed", match=to("blocked"), timeout=60)
    assert "pay" in blocked["data"]["reason"], blocked["data"]["reason"]
    assert (lines(d, "pay"), lines(d, "ship")) == (1, 0)
    assert len(runs(d)) == 1
    d.ctl("resolve", "agent", "--accept", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "pay"), lines(d, "ship")) == (1, 1)


EXPORT_MID_TURN = """
with connect() as run:
    run.step("pay", lambda: count("pay"))
    run.model_call("m-1", {"q": "hi"}, lambda: count("model") and {"say": "hi"})
    run.step("edit_file", lambda: count("edits-" + run.session), side_effect="workspace-write")
    run.complete()
"""


def test_an_exported_and_imported_turn_replays_what_the_original_did(d: Daemon) -> None:
    """Export a session blocked mid-turn and import it as another: the copy's run
    replays the paid step and the model's answer from the log (the world has them
    once) and does only its own new step."""
    program(d, EXPORT_MID_TURN, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    bundle = d.root / "agent.bundle"
    d.ctl("export", "agent", "-o", str(bundle), check=True)
    d.ctl("import", str(bundle), "--as", "copy", check=True)
    shown = d.json("show", "copy")
    assert [a["tool"] for a in shown["pending_approvals"]] == ["edit_file"]
    d.ctl("approve", "copy", check=True)
    wait_event(d, "copy", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "pay"), lines(d, "model"), lines(d, "edits-copy")) == (1, 1, 1)
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "pay"), lines(d, "model"), lines(d, "edits-agent")) == (1, 1, 1)


STOP_BEFORE_APPROVED = """
with connect() as run:
    run.step("look", lambda: count("look"), **SAFE)
    count("runs")
    if n("runs") == 2:                       # work between steps, in the second run:
        Path("hold.reached").write_text("1") # the test interrupts here
        while not run.stop_requested:
            time.sleep(0.01)
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


def test_a_stop_is_honoured_at_an_approved_step(d: Daemon) -> None:
    """BUG (fixed on this branch).
    ``sdk.step`` answered a step recorded ``approved`` by starting it even when the
    run had been asked to stop (interrupt, suspend, shutdown, a spent budget, a
    divergence in another thread): the daemon checked ``stop_requested`` only for
    steps not recorded yet. The interrupted run did the approved work anyway."""
    program(d, STOP_BEFORE_APPROVED, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_for((d.root / "hold.reached").exists, what="the second run to reach its hold")
    d.ctl("interrupt", "agent", check=True)
    assert settle_sleeping(d) == "sleeping"
    assert lines(d, "edits") == 0  # the stop came first: the step did not start
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "look"), lines(d, "edits")) == (1, 1)


def test_approve_racing_activates_starts_the_approved_step_once(d: Daemon) -> None:
    """An approval and a burst of activates at once: however the wakes fall, the
    approved step runs once and the finished ones are replayed."""
    program(d, EXPORT_MID_TURN, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    import subprocess

    from tests.e2e.harness import SESSIONCTL

    procs = [
        subprocess.Popen(
            [SESSIONCTL, cmd, "agent"],
            env=d.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for cmd in ("activate", "activate", "approve", "activate", "activate", "activate")
    ]
    for p in procs:
        p.wait(60)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "pay"), lines(d, "model"), lines(d, "edits-agent")) == (1, 1, 1)
    started = [
        r
        for r in d.json("log", "agent", "--type", "tool.started")
        if r["data"]["tool"] == "edit_file"
    ]
    assert len(started) == 1


SEND_THEN_ASK = """
with connect() as run:
    run.step("pay", lambda: count("pay"))
    run.send("other", "paid")
    if n("pay-seen") == 0:
        count("pay-seen")
        Path("hold.reached").write_text("1")   # the daemon is shut down here (run 1)
        while not run.stop_requested:
            time.sleep(0.01)
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


def test_a_shutdown_mid_turn_then_an_approval_sends_the_message_once(d: Daemon) -> None:
    """A send is a step: across a daemon shutdown (a stop at a stable point), its
    restart (the turn continues once) and an approval, the other session gets one
    message and the paid step runs once."""
    program(d, "with connect() as run:\n    run.sleep()\n", name="other")
    program(d, SEND_THEN_ASK, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_for((d.root / "hold.reached").exists, what="the send to be done")
    assert d.stop() == 0  # SIGTERM: a clean shutdown
    d.start()
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "pay"), lines(d, "edits")) == (1, 1)
    got = [
        r["data"]
        for r in d.json("log", "other", "--type", "message.received")
        if r["data"]["sender"] == "agent"
    ]
    assert [m["text"] for m in got] == ["paid"]
    assert [r["data"]["turn"] for r in runs(d)] == [1, 1, 1]


DENY_EVERY_RUN = """
with connect() as run:
    try:
        run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    except Denied:
        count("denied")
    run.step("deploy", lambda: count("deploy"), side_effect="external-write")
    run.complete()
"""


def test_a_denial_holds_in_every_later_run_of_the_turn_across_a_kill9(d: Daemon) -> None:
    program(d, DENY_EVERY_RUN, policy='ask = ["edit_file", "deploy"]')
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    since = seq(d) + 1
    d.ctl("deny", "agent", check=True)
    d.ctl("activate", "agent")  # whatever the deny left it as, the turn goes on
    wait_event(d, "agent", "lifecycle.changed", since=since, match=to("blocked"))
    d.kill9()
    d.start()
    assert d.json("show", "agent")["state"] == "blocked"
    d.ctl("approve", "agent", check=True)  # deploy
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert (lines(d, "edits"), lines(d, "deploy")) == (0, 1)
    assert lines(d, "denied") >= 2  # every run after the denial saw it
