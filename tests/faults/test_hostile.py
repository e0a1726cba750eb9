"""Hostile input against the real daemon: every case is refused with a clear error,
the daemon still serves, and nothing is lost.

tests/faults/ — the hostile part of the "prove it" issue
--------------------------------------------------------
Each test starts the real ``sessiond`` (tests/e2e/harness.py) and drives it through
its socket or the real ``sessionctl``; ``conftest.py`` reaps the daemons. What is
covered here, beside what other files already prove:

* a hypothesis fuzzer of RPC frames (well-formed frames over the server's own
  dispatch table and unknown methods, params with path traversal, NULs, huge
  ints, deep nesting and oversized values, and raw byte mutations of them): each
  answer is ok or an error with a documented code (docs/rpc.md) and a message,
  never ``internal``; the connection stays open; a session made before keeps
  exactly its events;
* path traversal in session names (create, show, log, send, fork --as, import --as);
* artifact references: traversal inside a bundle's events or member names, an
  artifact replaced by a symlink in the state dir, a reference quoted in tool
  arguments (data, not evidence: export and fork must still work);
* bundles with wrong hashes, a seq gap, a repeated seq, links, traversal, and
  paths that are not files (a FIFO, /dev/zero, a folder), through ``sessionctl import``;
* symlinks planted in the state dir before start (a session folder, a log, a
  dangling log, a spec, the lock file);
* a run token replayed after its run ended, through raw RPC and the SDK.

Covered elsewhere, not repeated: random junk frames, one oversized frame and idle
clients (tests/e2e/test_rpc_fuzz.py), spec fuzzing (tests/test_spec_fuzz.py), bad
bundles at library level (tests/test_bundle.py), planted symlinks at library level
(tests/test_file_log.py), a peer with another uid (tests/e2e/test_daemon.py).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, cast, get_args, get_origin

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sessiond.codec import decode_line, frame
from sessiond.ipc.dispatch import method_table
from sessiond.ipc.params import LogParams
from sessiond.log.events import EVENT_TYPES
from sessiond.syscalls.kernel import Kernel
from tests.e2e.harness import Daemon, running, wait_event
from tests.test_bundle import _fix_manifest, _gap, _rewrite, _tamper_artifact

ROOT = Path(__file__).resolve().parents[2]
SENTINEL = "keep"
FRAME_LIMIT = 4096  # small, so the fuzzer makes oversized frames cheaply


# --- what the daemon promises ---------------------------------------------------------


def documented_errors() -> dict[str, int]:
    """Error code -> exit code, from the table in docs/rpc.md (the contract)."""
    section = (ROOT / "docs" / "rpc.md").read_text().split("## Errors", 1)[1].split("\n## ")[0]
    codes: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].isdigit():
            codes.update(dict.fromkeys(re.findall(r"`([a-z_]+)`", cells[0]), int(cells[1])))
    return codes


def dispatch_table() -> dict[str, type[BaseModel]]:
    """Method -> params model, from the server's own method table (so a new method is
    fuzzed too). Building the table only wires lambdas: the kernel is never called here."""
    table: dict[str, type[BaseModel]] = {"log": LogParams}
    methods = method_table(cast(Kernel, None), cast(Any, None))
    table.update((name, model) for name, (model, _) in methods.items())
    return table


ERRORS = documented_errors()
METHODS = dispatch_table()
# Methods that change nothing: the only ones the fuzzer may aim at the sentinel.
READ_ONLY = {"ping", "ps", "show", "log", "replay", "gate"}
NAME_FIELDS = {"name", "new", "to", "child", "into", "session"}


# --- talking to the daemon ------------------------------------------------------------


def connect(d: Daemon) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(d.socket))
    sock.settimeout(20)  # bounded: a daemon that stops answering fails the test
    return sock


def read_answers(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = []
    buf = b""
    while len(answers) < count:
        while b"\n" not in buf:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise AssertionError(f"the daemon closed the connection after {answers}")
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        answers.append(orjson.loads(line))
    assert not buf, f"more answers than frames: {buf[:200]!r}"
    return answers


def rpc(d: Daemon, method: str, params: dict[str, Any]) -> dict[str, Any]:
    with connect(d) as sock:
        sock.sendall(orjson.dumps({"id": 1, "method": method, "params": params}) + b"\n")
        return read_answers(sock, 1)[0]


def everything(d: Daemon) -> dict[str, list[dict[str, Any]]]:
    """Every session's whole log, through the socket: what "nothing lost" compares."""
    names = [row["name"] for row in rpc(d, "ps", {})["result"]]
    return {n: rpc(d, "log", {"name": n})["result"] for n in names}


# What the daemon logs when something escaped its error handling; "raw" is the
# harness's name for a stderr line that is not JSON (a traceback).
CRASH_EVENTS = {"request.failed", "connection.failed", "raw"}


def serving(d: Daemon) -> None:
    """The daemon is alive and answers, and it logged no unexpected exception."""
    assert d.proc is not None
    assert d.proc.poll() is None
    assert rpc(d, "ping", {})["ok"] is True
    crashes = [line for line in d.lines if line.get("event") in CRASH_EVENTS]
    assert not crashes, crashes


def refused(done: subprocess.CompletedProcess[str], code: str, *needles: str) -> str:
    """`sessionctl --json ...` was refused with ``code`` and its documented exit code;
    the message names each needle."""
    error = orjson.loads(done.stdout)["error"]
    assert error["code"] == code, error
    assert done.returncode == ERRORS[code], (done.returncode, error)
    for needle in needles:
        assert needle in error["message"], (needle, error)
    message: str = error["message"]
    assert message in done.stderr  # people see it too
    return message


def make_sentinel(d: Daemon) -> None:
    d.ctl("create", str(d.write_spec(SENTINEL, f'name = "{SENTINEL}"\n')), check=True)
    d.ctl("send", SENTINEL, "keep me", check=True)


def run_job(d: Daemon, name: str, script: str) -> dict[str, Any]:
    """A command session whose run leaves its stdout as an artifact; the run.finished."""
    (d.root / name).mkdir()
    spec = f'name = "{name}"\n[run]\nexec = ["sh", "-c", "{script}"]\ncwd = "{d.root / name}"\n'
    d.ctl("create", str(d.write_spec(name, spec)), check=True)
    d.ctl("activate", name, check=True)
    return wait_event(d, name, "run.finished")


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
        files = sorted(p.relative_to(d.state_dir) for p in d.state_dir.rglob("*"))
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
        assert sorted(p.relative_to(d.state_dir) for p in d.state_dir.rglob("*")) == files


# --- 2. path traversal in session names ------------------------------------------------------


EVIL_NAMES = ["../evil", "../../evil", "a/../../evil", "/tmp/evil", ".evil", "..", "Evil",
              "x" * 65, "evil\n"]  # fmt: skip


def test_path_traversal_in_session_names_is_refused_wherever_a_name_goes_in() -> None:
    with running() as d:
        make_sentinel(d)
        bundle = d.root / "keep.bundle"
        d.ctl("export", SENTINEL, "-o", str(bundle), check=True)
        before = everything(d)
        for n, evil in enumerate(EVIL_NAMES):
            spec = d.write_spec(f"spec-{n}", f"name = {orjson.dumps(evil).decode()}\n")
            refused(d.ctl("--json", "create", str(spec)), "bad_spec", f"{spec}: name:", repr(evil))
            for args in (
                ("show", evil),
                ("log", evil),
                ("send", evil, "hi"),
                ("fork", SENTINEL, "--as", evil),
                ("import", str(bundle), "--as", evil),
            ):
                refused(d.ctl("--json", *args), "bad_name", repr(evil), "is not allowed")
        # The daemon's own checks, not only sessionctl's: a NUL goes only by RPC.
        for method, params in (
            ("show", {"name": "x\x00y"}),
            ("fork", {"name": SENTINEL, "new": "../\x00evil"}),
            ("merge", {"child": SENTINEL, "into": "../evil"}),
        ):
            answer = rpc(d, method, params)
            assert answer["error"]["code"] == "bad_name", answer
        serving(d)
        assert everything(d) == before
        made = [p for p in d.root.rglob("*") if "evil" in p.name.lower()]
        assert made == [], made
        assert os.listdir(d.state_dir / "sessions") == [SENTINEL]  # no leftover temp folder


# --- 3. artifact references ------------------------------------------------------------------


def test_an_artifact_replaced_by_a_symlink_is_never_read_through() -> None:
    with running() as d:
        finished = run_job(d, "job", "echo evidence")
        ref = finished["data"]["stdout"]["ref"]
        before = everything(d)
        secret = d.root / "secret"
        secret.write_bytes(b"not the daemon's to read\n")
        artifact = d.state_dir / "sessions" / "job" / "artifacts" / ref[7:]
        artifact.unlink()
        artifact.symlink_to(secret)
        out = d.root / "job.bundle"
        refused(
            d.ctl("--json", "export", "job", "-o", str(out)),
            "artifact_corrupt",
            ref,
            "cannot be read safely",
        )
        assert not out.exists()
        refused(d.ctl("--json", "fork", "job", "--as", "copy"), "artifact_corrupt", ref)
        gate = orjson.loads(d.ctl("--json", "gate", "job").stdout)  # exit 1: not ok
        check = next(c for c in gate["checks"] if c["name"] == "artifacts present")
        assert check["ok"] is False
        assert ref in check["detail"]
        serving(d)
        assert everything(d) == before
        assert sorted(os.listdir(d.state_dir / "sessions")) == ["job"]
        copies = [p for p in d.state_dir.rglob("*") if p.is_file() and not p.is_symlink()]
        assert all(secret.read_bytes() not in p.read_bytes() for p in copies)


SDK_QUOTER = """
from sessiond.sdk import connect
with connect() as run:
    quoted = {"ref": "sha256:" + "0" * 64, "name": "made up", "size": 1}
    with run.tool("read_file", {"path": "x", "see": quoted}, side_effect="read",
                  idempotency="safe") as call:
        call.finish(output="read", observation="read x")
"""


def test_a_reference_quoted_in_tool_arguments_is_data_and_export_and_fork_still_work() -> None:
    with running() as d:
        program = d.root / "quoter.py"
        program.write_text(SDK_QUOTER)
        (d.root / "w").mkdir()
        spec = (
            f'name = "agent"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{program}"]\n'
            f'cwd = "{d.root / "w"}"\n'
        )
        d.ctl("create", str(d.write_spec("agent", spec)), check=True)
        d.ctl("activate", "agent", check=True)
        wait_event(d, "agent", "run.finished")
        intent = d.json("log", "agent", "--type", "tool.intent")[0]
        assert intent["data"]["args"]["see"]["ref"] == "sha256:" + "0" * 64
        out = d.root / "agent.bundle"
        d.ctl("export", "agent", "-o", str(out), check=True)
        exported = d.json("log", "agent")
        d.ctl("fork", "agent", "--as", "child", check=True)
        d.ctl("import", str(out), "--as", "again", check=True)
        logs = everything(d)
        assert logs["again"][: len(exported)] == exported
        assert logs["child"][: len(exported)] == exported
        serving(d)


# --- 4. bundles through `sessionctl import` -------------------------------------------------


def _event_ref_traversal(m: dict[str, bytes]) -> None:
    """A run.finished whose stdout reference climbs out of the store (good checksum)."""
    lines = m["events.jsonl"].splitlines(keepends=True)
    for i, line in enumerate(lines):
        record = decode_line(line[:-1])
        assert record is not None
        if record["type"] == "run.finished":
            record["data"]["stdout"]["ref"] = "sha256:../../../../etc/passwd"
            lines[i] = frame(orjson.dumps(record))
    m["events.jsonl"] = b"".join(lines)
    _fix_manifest(m)


def _repeated_seq(m: dict[str, bytes]) -> None:
    lines = m["events.jsonl"].splitlines(keepends=True)
    m["events.jsonl"] = b"".join([*lines[:3], lines[2], *lines[3:]])
    _fix_manifest(m)


def _member_traversal(m: dict[str, bytes]) -> None:
    m["artifacts/../../../evil"] = b"planted"


def _absolute_member(m: dict[str, bytes]) -> None:
    m["/tmp/evil"] = b"planted"


def _tamper_events(m: dict[str, bytes]) -> None:
    events = bytearray(m["events.jsonl"])
    events[20] ^= 1  # one bit, the manifest as it was
    m["events.jsonl"] = bytes(events)


def _wrong_manifest_hash(m: dict[str, bytes]) -> None:
    manifest = orjson.loads(m["manifest.json"])
    manifest["events"]["sha256"] = "0" * 64
    m["manifest.json"] = orjson.dumps(manifest)


BAD_BUNDLES: dict[str, tuple[Callable[[dict[str, bytes]], None], str]] = {
    "artifact hash": (_tamper_artifact, "does not match its hash"),
    "events hash": (_tamper_events, "does not match the hash"),
    "manifest hash": (_wrong_manifest_hash, "does not match the hash"),
    "seq gap": (_gap, "without gaps"),
    "repeated seq": (_repeated_seq, "without gaps"),
    "ref traversal": (_event_ref_traversal, "stdout.ref"),
    "member traversal": (_member_traversal, "'artifacts/../../../evil' is not allowed"),
    "absolute member": (_absolute_member, "'/tmp/evil' is not allowed"),
}


def _with_link(bundle: Path, out: Path) -> None:
    """The bundle with its events.jsonl swapped for a symlink to /etc/passwd."""
    with tarfile.open(bundle, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for info in src.getmembers():
            if info.name == "events.jsonl":
                link = tarfile.TarInfo("events.jsonl")
                link.type = tarfile.SYMTYPE
                link.linkname = "/etc/passwd"
                dst.addfile(link)
            else:
                dst.addfile(info, src.extractfile(info))


def test_a_bad_bundle_is_refused_whole_by_import_and_the_daemon_goes_on() -> None:
    with running() as d:
        make_sentinel(d)
        run_job(d, "job", "echo evidence")
        good = d.root / "job.bundle"
        d.ctl("export", "job", "-o", str(good), check=True)
        before = everything(d)
        cases: list[tuple[str, Path, str]] = []
        for case, (change, needle) in sorted(BAD_BUNDLES.items()):
            path = d.root / f"{case.replace(' ', '-')}.bundle"
            shutil.copy(good, path)
            _rewrite(path, change)
            cases.append((case, path, needle))
        _with_link(good, d.root / "link.bundle")
        cases.append(("link member", d.root / "link.bundle", "links are refused"))
        fifo = d.root / "fifo.bundle"
        os.mkfifo(fifo)  # opened without O_NONBLOCK it would block the whole daemon
        cases += [
            ("fifo", fifo, "not a regular file"),
            ("endless device", Path("/dev/zero"), "not a regular file"),
            ("folder", d.root, "not a regular file"),
            ("missing", d.root / "missing.bundle", "cannot read bundle"),
        ]
        for case, path, needle in cases:
            done = d.ctl("--json", "import", str(path), "--as", "copy")
            message = refused(done, "bad_bundle", needle)
            assert str(path) in message, (case, message)  # which file, of several
            assert rpc(d, "show", {"name": "copy"})["error"]["code"] == "no_such_session", case
            assert sorted(os.listdir(d.state_dir / "sessions")) == ["job", SENTINEL], case
        serving(d)
        assert everything(d) == before
        d.ctl("import", str(good), "--as", "copy", check=True)  # the good one still imports


# --- 5. symlinks planted in the state dir before start ----------------------------------------


def test_symlinks_planted_in_the_state_dir_block_their_session_and_are_never_followed() -> None:
    with running() as d:
        planted = ["folder", "log", "dangling", "spec"]
        for name in [*planted, "fine"]:
            d.ctl("create", str(d.write_spec(name, f'name = "{name}"\n')), check=True)
            d.ctl("send", name, "keep me", check=True)
        before = everything(d)
        d.stop()
        sessions = d.state_dir / "sessions"
        outside = d.root / "outside"
        outside.mkdir()
        shutil.move(sessions / "folder", outside / "folder")
        (sessions / "folder").symlink_to(outside / "folder")
        shutil.move(sessions / "log" / "events.jsonl", outside / "events.jsonl")
        (sessions / "log" / "events.jsonl").symlink_to(outside / "events.jsonl")
        shutil.move(sessions / "dangling" / "events.jsonl", outside / "dangling.jsonl")
        (sessions / "dangling" / "events.jsonl").symlink_to(outside / "nowhere")
        victim = outside / "spec.toml"  # what a followed symlink would make it run
        victim.write_text(f'name = "spec"\n[run]\nexec = ["touch", "{outside / "ran"}"]\n')
        shutil.move(sessions / "spec" / "spec.toml", outside / "real-spec.toml")
        (sessions / "spec" / "spec.toml").symlink_to(victim)
        contents = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}

        d.start()
        rows = {row["name"]: row for row in d.json("ps")}
        assert sorted(rows) == sorted([*planted, "fine"])  # none vanished
        for name in planted:
            assert rows[name]["state"] == "blocked", rows[name]
            assert "is a symbolic link" in rows[name]["reason"], rows[name]
            logged = [line for line in d.lines if line.get("session") == name]
            assert any(line.get("level") == "error" for line in logged), name
            refused(d.ctl("--json", "send", name, "x"), "refused", "symbolic link")
            refused(d.ctl("--json", "activate", name), "refused", "symbolic link")
        for name in ("folder", "log", "dangling"):
            refused(d.ctl("--json", "log", name), "storage", "is a symbolic link")
        assert d.ctl("export", "folder", "-o", str(d.root / "f.bundle")).returncode == 70
        assert not (d.root / "f.bundle").exists()
        assert rows["fine"]["state"] == "created"
        d.ctl("send", "fine", "still served", check=True)
        assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == contents
        assert not (outside / "ran").exists()
        serving(d)

        # Nothing was lost: with the real files back, every session is whole again.
        d.stop()
        (sessions / "folder").unlink()
        shutil.move(outside / "folder", sessions / "folder")
        for name, src in (("log", "events.jsonl"), ("dangling", "dangling.jsonl")):
            (sessions / name / "events.jsonl").unlink()
            shutil.move(outside / src, sessions / name / "events.jsonl")
        (sessions / "spec" / "spec.toml").unlink()
        shutil.move(outside / "real-spec.toml", sessions / "spec" / "spec.toml")
        d.start()
        after = everything(d)
        assert after["fine"][: len(before["fine"])] == before["fine"]
        assert {n: after[n] for n in planted} == {n: before[n] for n in planted}


def test_a_lock_file_planted_as_a_symlink_stops_the_start_and_its_target_is_untouched() -> None:
    with running() as d:
        make_sentinel(d)
        before = everything(d)
        d.stop()
        victim = d.root / "victim"
        victim.write_bytes(b"precious\n")
        lock = d.state_dir / "sessiond.lock"
        lock.unlink()
        lock.symlink_to(victim)
        d.start(wait=False)
        assert d.proc is not None
        assert d.proc.wait(30) == 1
        d.stop()  # collects what it said
        said = " ".join(str(line.get("text", "")) for line in d.lines)
        assert f"{lock} is a symbolic link" in said, d.lines
        assert victim.read_bytes() == b"precious\n"
        lock.unlink()
        d.start()
        assert everything(d) == before


# --- 6. a run token replayed after its run ----------------------------------------------------


TOKEN_KEEPER = """
import os, pathlib, time
from sessiond.sdk import connect
n = len(list(pathlib.Path(".").glob("token-*")))
env = os.environ
pathlib.Path(f"token-{n}").write_text(env["SESSIOND_TOKEN"] + " " + env["SESSIOND_RUN"])
with connect() as run:
    with run.tool("read_file", {"path": "x"}, side_effect="read", idempotency="safe") as call:
        call.finish(output="read", observation="read x")
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
            "sdk.tool": {"tool": "send_email", "args": {"to": "x"}},
            "sdk.started": {"call": call},
            "sdk.finished": {"call": call, "output": "again"},
            "sdk.model": {"model": "m", "request": {}, "response": {}},
            "sdk.verify": {"check": "tests", "ok": True},
            "sdk.send": {"to": SENTINEL, "text": "from a dead run"},
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
