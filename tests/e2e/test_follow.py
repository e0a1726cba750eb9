"""`sessionctl log`: a follow that loses nothing, and the journalctl-style filters.

Against the real daemon with a small ``follow_buffer`` (the daemon's bound on what a
follower may be behind): a reader that stops reading while a session takes more
events than its socket and that bound hold is ended with ``fell_behind`` naming the
last seq sent, and ``sessionctl log -f`` catches up from the log by itself, so
what it prints is every seq once, in order. Nothing here sleeps: "the reader is
stalled" is a pipe or a socket nobody reads until every send has been answered,
and a send is answered after its event has reached every follower's buffer.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from tests.e2e.harness import SESSIONCTL, Daemon, running

BOUND = 20
TEXT = "x" * 8192  # big events, so that a few hundred fill every socket buffer
SENDS = 400  # 3 MiB of events: far more than the buffers and BOUND hold
CONFIG = f'durability = "os"\nfollow_buffer = {BOUND}\n'


def connect(d: Daemon) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
    sock.connect(str(d.socket))
    sock.settimeout(30)  # bounded: a daemon that stops answering fails the test
    return sock


class Lines:
    """Newline-delimited JSON frames off a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def next(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise AssertionError("the daemon closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        frame: dict[str, Any] = orjson.loads(line)
        return frame


def request(sock: socket.socket, rid: int, method: str, params: dict[str, Any]) -> None:
    sock.sendall(orjson.dumps({"id": rid, "method": method, "params": params}) + b"\n")


def call(d: Daemon, method: str, params: dict[str, Any]) -> dict[str, Any]:
    with connect(d) as sock:
        request(sock, 1, method, params)
        return Lines(sock).next()


def create(d: Daemon, name: str) -> None:
    d.ctl("create", str(d.write_spec(name, f'name = "{name}"\n')), check=True)


def flood(d: Daemon, names: list[str], count: int, text: str = TEXT) -> None:
    """``count`` sends spread over ``names``, pipelined on one connection; returns
    once every one is answered (so every follower's buffer has seen each event)."""
    with connect(d) as sock:
        frames = b"".join(
            orjson.dumps(
                {"id": i, "method": "send", "params": {"to": names[i % len(names)], "text": text}}
            )
            + b"\n"
            for i in range(count)
        )
        writer = threading.Thread(target=sock.sendall, args=(frames,), daemon=True)
        writer.start()
        lines = Lines(sock)
        for _ in range(count):
            answer = lines.next()
            assert answer.get("ok"), answer
        writer.join(30)
    assert call(d, "ping", {})["ok"]  # the daemon answers while the reader is stalled


def seqs_of(d: Daemon, name: str) -> int:
    seq: int = d.json("show", name)["seq"]
    return seq


def behind_logged(d: Daemon) -> list[dict[str, Any]]:
    return [line for line in d.lines if line.get("event") == "follow.fell_behind"]


@pytest.mark.parametrize(
    ("config", "count", "text"),
    [
        (CONFIG, SENDS, TEXT),
        # the report of issue 13: the default bound (10,000) and 15,000 sends
        pytest.param('durability = "os"\n', 15_000, "m", marks=pytest.mark.slow),
    ],
    ids=["bound 20", "default bound"],
)
def test_a_stalled_raw_follower_is_told_where_it_fell_behind_and_the_stream_ends(
    config: str, count: int, text: str
) -> None:
    with running(config) as d:
        create(d, "s")
        with connect(d) as follower:
            request(follower, 7, "log", {"name": "s", "follow": True})
            frames = Lines(follower)
            first = frames.next()  # the backlog has begun: the follow is listening
            assert first["stream"]["seq"] == 1
            flood(d, ["s"], count, text)  # nobody reads `follower` meanwhile
            got = [first["stream"]["seq"]]
            while "stream" in (frame := frames.next()):
                got.append(frame["stream"]["seq"])
            assert frame["id"] == 7, frame
            assert frame["ok"] is False, frame
            err = frame["error"]
            assert err["code"] == "fell_behind", err
            assert err["exit"] == 1, err
            assert got == list(range(1, got[-1] + 1))  # in order, none missing before it
            assert got[-1] < seqs_of(d, "s")  # it did fall behind
            assert err["last_seq"] == {"s": got[-1]}, err
            assert f"s seq {got[-1]}" in err["message"]
            # The stream is over: the same connection answers the next request.
            request(follower, 8, "ping", {})
            answer = frames.next()
            assert answer["id"] == 8, answer
            assert answer["ok"] is True, answer
        assert behind_logged(d)
        assert call(d, "ping", {})["ok"]


def assert_a_stalled_sessionctl_gets_everything(
    d: Daemon, names: list[str], count: int, text: str
) -> None:
    """``sessionctl --json log -f`` (of ``names[0]``, or ``--all``) whose stdout is not
    read while ``count`` sends of ``text`` go to ``names``: afterwards it prints every
    seq of each session once, in order, and the daemon did end its stream for being
    behind (else this proved nothing)."""
    every = len(names) > 1
    # With --all, `-n 1` sends the newest event first, read after the follow
    # began listening: once it is printed, the follow is certain to see the rest.
    args = ["--all", "-n", "1"] if every else [names[0]]
    proc = subprocess.Popen(
        [SESSIONCTL, "--json", "log", *args, "-f"],
        env=d.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        first = orjson.loads(proc.stdout.readline())
        flood(d, names, count, text)  # its stdout is not read meanwhile: it stalls
        want = {n: seqs_of(d, n) for n in names}
        got: dict[str, list[int]] = {n: [] for n in names}
        got[first["session"]].append(first["seq"])
        done = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                record = orjson.loads(raw)
                got[record["session"]].append(record["seq"])
                if all(got[n] and got[n][-1] == want[n] for n in names):
                    break
            done.set()

        threading.Thread(target=read, daemon=True).start()
        assert done.wait(90), f"not every event came: { ({n: len(v) for n, v in got.items()}) }"
    finally:
        proc.kill()
        proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    for name in names:
        start = got[name][0]
        assert got[name] == list(range(start, want[name] + 1)), name  # once each, in order
    if not every:
        assert got[names[0]][0] == 1
    assert behind_logged(d), "the follower never fell behind: the test proved nothing"


@pytest.mark.parametrize("every", [False, True], ids=["one session", "--all"])
def test_a_stalled_sessionctl_follower_catches_up_and_prints_every_event_once(
    every: bool,
) -> None:
    names = ["a", "b"] if every else ["a"]
    with running(CONFIG) as d:
        for name in names:
            create(d, name)
        assert_a_stalled_sessionctl_gets_everything(d, names, SENDS, TEXT)


@pytest.mark.slow
def test_15000_sends_to_a_stalled_follower_at_the_default_bound_all_arrive() -> None:
    """The report of issue 13, as it was: the default bound (10,000), 15,000 sends."""
    with running('durability = "os"\n') as d:
        create(d, "a")
        assert_a_stalled_sessionctl_gets_everything(d, ["a"], 15_000, "m")


# --- the filters ---------------------------------------------------------------------


def seqs(d: Daemon, *args: str) -> list[int]:
    return [r["seq"] for r in d.json("log", "s", *args)]


def test_since_a_duration_or_a_time_grep_and_the_last_n() -> None:
    # The daemon's clock runs 2 h ahead for the events sent after the restart, so
    # that "since 1h" and a timestamp can tell the early events from the late ones.
    with running() as d:
        create(d, "s")
        d.ctl("send", "s", "early apple", check=True)
        d.ctl("send", "s", "early pear", check=True)
        early = seqs_of(d, "s")
        d.stop()
        d.config.write_text(d.config.read_text() + "clock_offset = 7200.0\n")
        d.start()
        d.ctl("send", "s", "late apple", check=True)
        d.ctl("send", "s", "late plum", check=True)
        total = seqs_of(d, "s")
        late = [r["seq"] for r in d.json("log", "s") if r["seq"] > early]
        assert seqs(d, "--since", "1h") == late
        assert seqs(d, "--since", "3h") == list(range(1, total + 1))
        assert seqs(d, "--since", "2") == list(range(2, total + 1))  # an integer is a seq
        cut = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        assert seqs(d, "--since", cut) == late
        apples = d.json("log", "s", "--grep", "appl[e]")
        texts = [r["data"].get("text") for r in apples if r["type"] == "message.received"]
        assert texts == ["early apple", "late apple"]
        assert all("apple" in orjson.dumps(r["data"]).decode() for r in apples)
        assert seqs(d, "-n", "2") == [total - 1, total]
        assert seqs(d, "--lines", "1", "--grep", "apple") == [apples[-1]["seq"]]
        assert seqs(d, "--limit", "1") == [total]  # the old spelling still works
        # -n with -f: the last N, then new ones.
        proc = subprocess.Popen(
            [SESSIONCTL, "--json", "log", "s", "-f", "-n", "2", "--grep", "apple|kiwi"],
            env=d.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert proc.stdout is not None
            shown = [orjson.loads(proc.stdout.readline())["seq"] for _ in range(2)]
            d.ctl("send", "s", "kiwi", check=True)
            shown.append(orjson.loads(proc.stdout.readline())["data"]["text"])
        finally:
            proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        assert shown[:2] == [r["seq"] for r in apples][-2:]
        assert shown[2] == "kiwi"


BAD_FILTERS = [
    (["--grep", "(unclosed"], "--grep '(unclosed' is not a regular expression"),
    (["--grep", "(unclosed", "-f"], "--grep '(unclosed' is not a regular expression"),
    (["--grep", r"(a)\1"], "cannot be matched in bounded time"),
    (["--since", "tomorrow"], "--since 'tomorrow' is not a seq"),
    (["--since", "10 parsecs"], "--since '10 parsecs' is not a seq"),
    (["--since", "2026-12-01T09:00:00"], "has no UTC offset"),
    (["--since", "0"], "--since 0 is not a seq"),
    (["-n", "-3"], "-n/--lines -3"),
]


def test_bad_filters_are_usage_errors_naming_the_value() -> None:
    with running() as d:
        create(d, "s")
        for args, needle in BAD_FILTERS:
            done = d.ctl("log", "s", *args)
            assert done.returncode == 2, (args, done)
            assert needle in done.stderr, (args, done.stderr)
            # A usage error needs no daemon: it is found before connecting.
            alone = d.ctl("--socket", str(d.root / "none.sock"), "log", "s", *args)
            assert alone.returncode == 2, (args, alone)
        assert call(d, "ping", {})["ok"]
