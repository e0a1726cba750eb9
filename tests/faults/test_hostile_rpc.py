"""Hostile RPC peers against the real daemon: every frame gets an answer or a
documented error, the connection and the daemon go on, and nothing is lost.

* a hypothesis fuzzer of RPC frames (well-formed frames over the server's own
  dispatch table and unknown methods, params with path traversal, NULs, huge
  ints, deep nesting and oversized values, and raw byte mutations of them): each
  answer is ok or an error with a documented code (docs/rpc.md) and a message,
  never ``internal``; the connection stays open; a session made before keeps
  exactly its events;
* a run token replayed after its run ended, through raw RPC and the SDK;
* specs whose numbers are NaN or infinite (TOML writes ``nan`` and ``inf``) sent
  through a real ``create``: refused as ``bad_spec`` naming the key and the value,
  and the daemon goes on;
* bad ``log`` filters (a negative ``limit``, a regex that does not compile or is
  huge, a ``since`` that is no seq nor time, a bad ``after``): ``invalid_input``
  naming the value, and the daemon goes on.

Covered elsewhere, not repeated: random junk frames, one oversized frame and idle
clients (tests/e2e/test_rpc_fuzz.py), spec fuzzing (tests/table/test_spec_fuzz.py), a
peer with another uid (tests/e2e/test_daemon.py). The helpers and the suite's
overview are in tests/faults/hostile.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessiond.log.events import EVENT_TYPES
from tests.e2e.harness import Daemon, running, wait_event
from tests.faults.hostile import (
    ERRORS,
    METHODS,
    SENTINEL,
    connect,
    everything,
    make_sentinel,
    read_answers,
    refused,
    rpc,
    serving,
)

FRAME_LIMIT = 4096  # small, so the fuzzer makes oversized frames cheaply
# Methods that change nothing: the only ones the fuzzer may aim at the sentinel.
READ_ONLY = {"ping", "ps", "show", "log", "replay", "gate"}
NAME_FIELDS = {"name", "new", "to", "child", "into", "session"}


# --- 1. the frame fuzzer -----------------------------------------------------------------


class Raw:
    """JSON text put into a frame as it is: what orjson.dumps will not write (nesting
    deeper than it recurses, integers past 64 bits, numbers that overflow a double)."""

    def __init__(self, text: bytes) -> None:
        self.text = text


def encode(value: Any) -> bytes:
    raws: list[bytes] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"@raw{len(raws) - 1}@"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    out = orjson.dumps(swap(value))
    for i, text in enumerate(raws):
        out = out.replace(f'"@raw{i}@"'.encode(), text, 1)
    return out


HOSTILE = [
    "../../etc/passwd", "../evil", "a/../../b", "/etc/shadow", "..", ".", "", ".hidden",
    "x\x00y", "\x00", "evil\n", "sha256:../../../etc/passwd", "sha256:" + "0" * 64,
    "x" * 300, "\u202e\u200b", "名前", "ghost", "-rf", "$(reboot)", "%s%n", "/dev/zero",
    "/proc/self/mem", "/proc/self/fd/0", "/", "C:\\evil", "\\\\host\\share",
]  # fmt: skip
# Words the handlers know, so that some values get past validation and go deeper.
WORDS = [*EVENT_TYPES, "state", "messages", "trace", "audit", "default", "rerun", "sleep",
         "complete", "ok", "error", 'name = "x"\n', 'name = "../x"\n[run]\n']  # fmt: skip
RAWS = [
    b"[" * 200 + b"]" * 200,
    b"[" * 1000 + b"]" * 1000,  # past orjson's depth limit with the frame around it
    b'{"a":' * 300 + b"1" + b"}" * 300,
    b"9" * 30,  # past 64 bits: a float to orjson
    b"-" + b"9" * 400,
    b"1e400",
    b"-0",
    b"1E-400",
]
# Hypothesis draws the first of equal choices (and small integers) more often than
# the rest; picking from a list with repeats gives the weights wanted here.
SOMETIMES = st.sampled_from([False] * 7 + [True])
METHOD_KIND = st.sampled_from(["known"] * 7 + ["unknown", "text", "odd"])
STRINGS = st.sampled_from(HOSTILE) | st.sampled_from(WORDS) | st.text(max_size=30)
INTS = st.integers(-3, 20) | st.integers(-(2**63), 2**64 - 1)
SCALARS = (
    st.none()
    | st.booleans()
    | INTS
    | st.floats(allow_nan=False, allow_infinity=False)
    | STRINGS
    | SOMETIMES.flatmap(lambda raw: st.sampled_from(RAWS).map(Raw) if raw else STRINGS)
)
FIELDS = sorted({f for model in METHODS.values() for f in model.model_fields})
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
UNKNOWN_METHODS = ["", "nope", "PING", "ping ", "sdk.", "sdk.nope", "log\x00", "__init__",
                   "methods", "_handle", "../ping", "ping\n"]  # fmt: skip


def typed(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of a params field's own type (hostile ones among them): these pass
    validation and reach the handler, where the interesting refusals are."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is str:
        return STRINGS
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return INTS
    if annotation is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, UnionType):
        return st.one_of(*(typed(a) for a in args))
    if origin is list:
        return st.lists(typed(args[0]), max_size=4)
    if origin is dict:
        return st.dictionaries(STRINGS, typed(args[1]), max_size=4)
    return VALUES


def away_from_sentinel(value: Any) -> Any:
    """The same value with the sentinel's name replaced: a changing method never
    touches the session whose log must stay as it was."""
    if value == SENTINEL:
        return "ghost"
    if isinstance(value, dict):
        return {k: away_from_sentinel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [away_from_sentinel(v) for v in value]
    return value


@st.composite
def requests(draw: st.DrawFn) -> Any:
    kind = draw(METHOD_KIND)
    method: Any = draw(
        {
            "known": st.sampled_from(sorted(METHODS)),  # where the handlers are
            "unknown": st.sampled_from(UNKNOWN_METHODS),
            "text": st.text(max_size=12),
            "odd": st.sampled_from([None, 7, True, [], {}]),
        }[kind]
    )
    named = method if isinstance(method, str) else ""
    model = METHODS.get(named)
    params: Any = {}
    if model is None:
        params = draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4))
    for field, info in (model.model_fields if model else {}).items():
        if not draw(SOMETIMES):  # most fields present, some left to their default
            params[field] = draw(VALUES if draw(SOMETIMES) else typed(info.annotation))
    if draw(SOMETIMES):
        params[draw(st.sampled_from(["evil", "__class__"]) | st.text(max_size=8))] = 1
    names = st.sampled_from(HOSTILE) | st.sampled_from(["ghost", "a.b", "x-1"])
    if named in READ_ONLY:
        names = names | st.just(SENTINEL)  # reads of a real session go deeper
    for field in NAME_FIELDS & set(params):
        if draw(st.booleans()):
            params[field] = draw(names)
    if named not in READ_ONLY:
        params = away_from_sentinel(params)
    if named == "log":
        params.pop("follow", None)  # a follow streams until the client leaves
    request: dict[str, Any] = {"method": method, "params": params}
    request["id"] = draw(VALUES if draw(SOMETIMES) else INTS | st.text(max_size=8))
    if draw(SOMETIMES):
        request.pop(draw(st.sampled_from(["id", "method", "params"])))
    if draw(SOMETIMES):
        request["params"] = draw(VALUES)  # not an object
    return request


INSERTS = [b"\xff", b"\x00", b"\n", b"\r\n", b"\xc0\xaf", b"\xed\xa0\x80", b'"', b"{",
           b"\\u0000", b"\\ud800", b"\xef\xbb\xbf"]  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A well-formed frame with bytes flipped, inserted (invalid UTF-8, NULs, a
    newline that splits it in two), deleted or cut off."""
    raw = bytearray(encode(draw(requests())))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "flip" and raw:
            raw[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            raw[at:at] = draw(st.sampled_from(INSERTS) | st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del raw[at : at + draw(st.integers(1, 8))]
        else:
            del raw[at:]
    return bytes(raw)


FRAME_KINDS = {
    "request": requests().map(encode),
    "mutated": mutated(),
    "junk": st.binary(max_size=200),
    "blank or bare": st.sampled_from([b"", b"   ", b"\t", b"[]", b"null", b"{}", b'"ping"']),
    "around the limit": st.integers(FRAME_LIMIT - 64, 3 * FRAME_LIMIT).map(
        lambda n: b'{"id":1,"method":"ping","params":{"x":"' + b"a" * n + b'"}}'
    ),
}


def frames() -> st.SearchStrategy[bytes]:
    """Bytes to send, before the delimiting newline: mostly well-formed requests
    (deeper into the handlers), then mutated ones, junk, blanks, oversized ones."""
    weights = ["request"] * 5 + ["mutated"] * 2 + ["junk", "blank or bare", "around the limit"]
    return st.sampled_from(weights).flatmap(FRAME_KINDS.__getitem__)


def expected_answers(payload: bytes) -> list[tuple[bool, Any]]:
    """For each line the daemon will answer: (too large?, the id it must echo).
    A line of whitespace gets no answer; any other line exactly one."""
    expected = []
    for part in payload.split(b"\n")[:-1]:
        if len(part) + 1 > FRAME_LIMIT:
            expected.append((True, None))
        elif part.strip():
            try:
                request = orjson.loads(part)
            except orjson.JSONDecodeError:
                request = None
            rid = request.get("id") if isinstance(request, dict) else None
            ok_id = isinstance(rid, int | str) and not isinstance(rid, bool)
            expected.append((False, rid if ok_id else None))
    return expected


def check_answer(answer: dict[str, Any], too_large: bool, rid: Any) -> None:
    assert "stream" not in answer
    assert answer["id"] == rid
    if answer["ok"] is True:
        assert set(answer) == {"id", "ok", "result"}
        assert not too_large
        return
    assert answer["ok"] is False
    assert set(answer) == {"id", "ok", "error"}
    error = answer["error"]
    assert error["code"] != "internal", error
    assert error["code"] in ERRORS, f"undocumented error code: {error}"
    assert error["exit"] == ERRORS[error["code"]], error
    assert isinstance(error["message"], str)
    assert error["message"].strip()
    if too_large:
        assert error["code"] == "frame_too_large"


PROFILE = settings()  # the profile in force: "ci" or "long" (tests/conftest.py)
FUZZ_SETTINGS = settings(
    PROFILE,
    max_examples=max(300, PROFILE.max_examples),
    suppress_health_check=[*PROFILE.suppress_health_check, HealthCheck.data_too_large],
)


def test_fuzzed_rpc_frames_get_an_answer_or_a_documented_error_and_harm_nothing() -> None:
    with running(f"max_frame_bytes = {FRAME_LIMIT}\n") as d:
        make_sentinel(d)
        before = everything(d)
        files = state_files(d)
        probe = b'{"id":"probe","method":"ping","params":{}}\n'

        @FUZZ_SETTINGS
        @given(st.lists(frames(), min_size=1, max_size=4))
        def fuzz(batch: list[bytes]) -> None:
            # Pipelined on one connection, then a ping: it is answered last, so the
            # connection stayed open and in step whatever came before. Every frame here
            # can be delimited (even an oversized one is skipped to its newline), so
            # none may close the connection.
            payload = b"".join(f + b"\n" for f in batch)
            expected = expected_answers(payload)
            with connect(d) as sock:
                sock.sendall(payload + probe)
                answers = read_answers(sock, len(expected) + 1)
            for answer, (too_large, rid) in zip(answers, expected, strict=False):
                check_answer(answer, too_large, rid)
            assert answers[-1] == {"id": "probe", "ok": True, "result": answers[-1]["result"]}

        fuzz()
        serving(d)
        assert everything(d) == before  # nothing lost, nothing added
        assert state_files(d) == files


def state_files(d: Daemon) -> list[Path]:
    """The state dir's files but ``table.index``: a cache of the ps rows that the
    daemon writes on its own a second after a change (the sentinel's creation), so
    it may appear meanwhile; what the fuzz may not change is compared above."""
    every = (p.relative_to(d.state_dir) for p in d.state_dir.rglob("*"))
    return sorted(p for p in every if p != Path("table.index"))


# --- 2. a run token replayed after its run ----------------------------------------------------


TOKEN_KEEPER = """
import os, pathlib, time
from sessiond.sdk import connect
n = len(list(pathlib.Path(".").glob("token-*")))
env = os.environ
pathlib.Path(f"token-{n}").write_text(env["SESSIOND_TOKEN"] + " " + env["SESSIOND_RUN"])
with connect() as run:
    run.step("read_file", lambda: "read", args={"path": "x"}, side_effect="read",
             idempotency="safe", resume="replay-from-event")
deadline = time.monotonic() + 30
while pathlib.Path("hold").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
"""


def test_a_run_token_replayed_after_its_run_is_refused_and_appends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with running() as d:
        make_sentinel(d)
        work = d.root / "w"
        work.mkdir()
        program = d.root / "keeper.py"
        program.write_text(TOKEN_KEEPER)
        spec = (
            f'name = "agent"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{program}"]\n'
            f'cwd = "{work}"\n[[trigger]]\ntype = "message"\n'  # sleeps between runs
        )
        d.ctl("create", str(d.write_spec("agent", spec)), check=True)
        d.ctl("activate", "agent", check=True)
        wait_event(d, "agent", "run.finished")
        token, run_id = (work / "token-0").read_text().split()
        call = d.json("log", "agent", "--type", "tool.intent")[0]["data"]["call"]
        before = everything(d)
        replays: dict[str, dict[str, Any]] = {
            "sdk.context": {},
            "sdk.step": {"name": "send_email", "ordinal": 1, "args": {"to": "x"}},
            "sdk.step_done": {"call": call, "result": "again"},
            "sdk.verify": {"check": "tests", "ok": True},
            "sdk.send": {"to": SENTINEL, "text": "from a dead run", "ordinal": 2},
            "sdk.end": {"intent": "complete"},
        }
        assert set(replays) == {m for m in METHODS if m.startswith("sdk.")}  # every one

        def replay_all() -> None:
            for method, params in replays.items():
                for session in ({"session": "agent"}, {}):
                    answer = rpc(d, method, {"token": token, **session, **params})
                    assert answer["error"]["code"] == "token_refused", (method, answer)
                    assert "ended" in answer["error"]["message"], answer

        replay_all()
        # Through the SDK as a program would use it: the same refusal, raised.
        from sessiond.sdk import connect
        from sessiond.wire import RemoteError

        for key, value in (("SOCKET", str(d.socket)), ("SESSION", "agent"), ("RUN", run_id)):
            monkeypatch.setenv(f"SESSIOND_{key}", value)
        monkeypatch.setenv("SESSIOND_TOKEN", token)
        with pytest.raises(RemoteError) as info, connect() as run:
            run.context()
        assert info.value.code == "token_refused"
        assert everything(d) == before

        # A new run of the same session does not bring the old token back.
        (work / "hold").touch()
        d.ctl("activate", "agent", check=True)
        wait_event(d, "agent", "observation.projected", since=len(before["agent"]) + 1)
        live = (work / "token-1").read_text().split()[0]
        assert live != token
        during = everything(d)
        replay_all()
        assert everything(d) == during
        assert rpc(d, "sdk.context", {"token": live, "session": "agent"})["ok"] is True
        (work / "hold").unlink()
        wait_event(d, "agent", "run.finished", since=len(before["agent"]) + 1)
        assert everything(d)[SENTINEL] == before[SENTINEL]
        serving(d)


# --- 3. numbers that are not finite in a spec -------------------------------------------------


NOT_FINITE = {
    "run.timeout": '[run]\nexec = ["true"]\ntimeout = {v}\n',
    "limits.interval": "[limits]\ninterval = {v}\n",
    "limits.cool_down": "[limits]\ncool_down = {v}\n",
    "policy.approval_ttl": "[policy]\napproval_ttl = {v}\n",
    "trigger[0].interval": '[[trigger]]\ntype = "every"\ninterval = {v}\n',
    "trigger[0].debounce": '[[trigger]]\ntype = "watch"\npaths = ["a"]\ndebounce = {v}\n',
    "trigger[0].jitter": '[[trigger]]\ntype = "cron"\nschedule = "0 9 * * *"\njitter = {v}\n',
}


def test_a_spec_with_nan_or_inf_is_refused_by_create_and_the_daemon_goes_on() -> None:
    with running() as d:
        make_sentinel(d)
        before = everything(d)
        for n, (key, table) in enumerate(NOT_FINITE.items()):
            for value in ("nan", "inf", "-inf", '"nan"', '"1e999s"'):
                text = f'name = "nf{n}"\n' + table.format(v=value)
                answer = rpc(d, "create", {"spec": text, "base": str(d.root), "source": "x.toml"})
                assert answer["ok"] is False, (key, value, answer)  # not created
                error = answer["error"]
                assert error["code"] == "bad_spec", (key, value, answer)
                assert error["message"].startswith(f"x.toml: {key}: "), (key, value, error)
                assert "is not a duration" in error["message"], (key, value, error)
                assert value.strip('"') in error["message"], (key, value, error)
            spec = d.write_spec(f"nf{n}", f'name = "nf{n}"\n' + table.format(v="nan"))
            message = refused(d.ctl("--json", "create", str(spec)), "bad_spec", f"{spec}: {key}:")
            assert "nan is not a duration: write a finite number" in message
        serving(d)
        assert everything(d) == before  # nothing made, nothing lost
        assert sorted(os.listdir(d.state_dir / "sessions")) == [SENTINEL]


# --- 4. bad log filters over raw RPC ------------------------------------------------------


BAD_LOG_PARAMS: list[tuple[dict[str, Any], str]] = [
    ({"limit": -1}, "limit"),
    ({"limit": -1, "follow": True}, "limit"),
    ({"grep": "(unclosed"}, "(unclosed"),
    ({"grep": "(unclosed", "follow": True}, "(unclosed"),
    ({"grep": "a" * 5000}, "grep"),
    ({"grep": "x{99999999999}"}, "x{99999999999}"),
    # what RE2 (linear time, no backtracking) cannot match: refused, named
    ({"grep": "(a)\\1"}, "cannot be matched in bounded time"),
    ({"grep": "x(?=y)", "follow": True}, "cannot be matched in bounded time"),
    ({"grep": "(a{1000}){1000}"}, "cannot be matched in bounded time"),
    ({"since": "tomorrow"}, "tomorrow"),
    ({"since": "tomorrow", "follow": True}, "tomorrow"),
    ({"until": "5"}, "until"),
    ({"until": "now", "follow": True}, "until"),
    ({"since": "2026-13-45T99:00:00Z"}, "2026-13-45T99:00:00Z"),
    ({"since": "2026-12-01T09:00:00"}, "UTC offset"),
    ({"since": "5"}, "JSON integer"),
    ({"since": "+10m"}, "+10m"),
    ({"since": "99999999999d"}, "100 years"),
    ({"since": "t" * 500}, "since"),
    ({"since": 0}, "since"),
    ({"since": -4}, "since"),
    ({"since": 1.5}, "since"),
    ({"since": True}, "since"),
    ({"after": {SENTINEL: -1}}, "after"),
    ({"after": [1, 2]}, "after"),
]


def test_bad_log_filters_are_invalid_input_naming_the_value() -> None:
    """Each refused with invalid_input naming the value, on one daemon that serves on."""
    with running() as d:
        make_sentinel(d)
        before = everything(d)
        for params, needle in BAD_LOG_PARAMS:
            answer = rpc(d, "log", {"name": SENTINEL, **params})
            assert answer["ok"] is False, (params, answer)
            assert answer["error"]["code"] == "invalid_input", (params, answer)
            assert answer["error"]["exit"] == ERRORS["invalid_input"], (params, answer)
            assert needle in answer["error"]["message"], (params, answer)
        serving(d)
        assert everything(d) == before
