"""The early server's ps (sessiond.ipc.early): the full server's answer, byte for
byte, and only for params the full server takes the same way."""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiond.errors import InvalidInput
from sessiond.ipc.dispatch import listing_of
from sessiond.ipc.early import Early, EarlyConfig, _ps_params, open_server
from sessiond.ipc.params import PsParams, parse
from sessiond.listing import Listing


def stamp(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


ROWS: list[dict[str, Any]] = [
    {"name": "b", "state": "sleeping", "agent": "x", "last_active": stamp(10), "labels": {}},
    {"name": "a", "state": "terminated", "agent": "y", "last_active": stamp(7200)},
    {"name": "c", "state": "terminated", "agent": "x", "last_active": stamp(60)},
    {"name": "d", "state": "created", "agent": None, "last_active": None, "labels": {"t": "1"}},
]


@pytest.fixture
def early() -> Iterator[Early]:
    listening, other = socket.socketpair()
    config = EarlyConfig(Path("/nonexistent"), Path("/nonexistent.sock"), True, 0.0)
    rows = sorted(({**r, "boundary": "sandbox"} for r in ROWS), key=lambda r: r["name"])
    e = Early(config, -1, listening, {"sessions": len(rows), "rows": rows, "read": None})  # type: ignore[typeddict-item]
    try:
        yield e
    finally:  # never started: what start() would have served on
        for closing in (listening, other, e._wake_r, e._wake_w, e._selector):
            closing.close()


def full(rows: list[Any], listing: Listing, footer: bool) -> bytes:
    """What sessiond.syscalls.kernel's ps_listed answers, encoded as the full
    server encodes it (sessiond.wire, sessiond.ipc.frames: non-str keys allowed)."""
    kept, hidden = listing.apply(rows, time.time())
    option = orjson.OPT_NON_STR_KEYS
    if not footer:
        return orjson.dumps(kept, option=option)
    page = {"rows": kept, "hidden": hidden, "known": [r["name"] for r in rows]}
    return orjson.dumps(page, option=option)


LISTINGS = [
    Listing(),
    Listing.of(all=True, sort="name"),
    Listing.of(["terminated"]),
    Listing.of(agents=["x"], sort="state"),
    Listing.of(labels=["t=1"], sort="last-active"),
]


@pytest.mark.parametrize("listing", LISTINGS)
@pytest.mark.parametrize("footer", [False, True])
def test_ps_is_the_full_servers_answer(early: Early, listing: Listing, footer: bool) -> None:
    assert early.rows is not None
    for _ in range(2):  # made, then sent again as made
        assert early.ps_result(listing, footer) == full(early.rows, listing, footer)


PARAMS: list[Any] = [
    {},
    {"all": True, "sort": "name", "footer": True},
    {"state": ["sleeping,blocked"], "agent": ["x"], "label": ["t=1"]},
    {"state": ["nosuch"]},
    {"sort": "nosuch"},
    {"all": 1},
    {"all": "true"},
    {"footer": None},
    {"state": "sleeping"},
    {"state": [1]},
    {"state": ["x" * 201]},
    {"label": ["t"]},
    {"state": ["sleeping"] * 65},
    {"sort": "n" * 33},
    {"extra": 1},
    {"token": "t"},
]


@pytest.mark.parametrize("params", PARAMS)
def test_ps_params_are_taken_only_as_the_full_server_takes_them(params: Any) -> None:
    mine = _ps_params(params)
    try:
        parsed = parse(PsParams, params)
        theirs: tuple[Listing, bool] | None = (listing_of(parsed), parsed.footer)
    except InvalidInput:
        theirs = None
    if mine is not None:  # what the early server answers, the full server answers alike
        assert mine == theirs
    assert (mine is None) == (theirs is None)


def serving(tmp_path: Path) -> tuple[Early, socket.socket]:
    """An early server on a real socket (no sessions), and a client that pinged
    it and then asked for a show in the same write: the show is held."""
    state = tmp_path / "state"
    (state / "sessions").mkdir(parents=True)
    config = EarlyConfig(state, tmp_path / "sock" / "s.sock", True, 0.0)
    lock = os.open(state / "sessiond.lock", os.O_RDWR | os.O_CREAT, 0o600)
    e = open_server(config, lock)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(config.socket))
    client.sendall(
        b'{"id":1,"method":"ping","params":{}}\n{"id":2,"method":"show","params":{"name":"a"}}\n'
    )
    pinged = orjson.loads(client.makefile("rb").readline())
    assert (pinged["id"], pinged["ok"], pinged["result"]["sessions"]) == (1, True, 0)
    return e, client


def test_a_failed_start_tells_a_waiting_client_why(tmp_path: Path) -> None:
    e, client = serving(tmp_path)
    with client:
        e.close("the state dir is read-only")
        told = orjson.loads(client.makefile("rb").readline())
    assert told["id"] == 2
    assert told["error"]["code"] == "unreachable"
    assert "the state dir is read-only" in told["error"]["message"]
    assert not (tmp_path / "sock" / "s.sock").exists()  # the socket went with it


def test_the_full_server_gets_the_held_request_unread(tmp_path: Path) -> None:
    e, client = serving(tmp_path)
    listening, held = e.hand_over()
    with client, listening:
        assert len(held) == 1
        assert held[0].unread == b'{"id":2,"method":"show","params":{"name":"a"}}\n'
        assert held[0].unsent == b""
        held[0].sock.close()
        os.close(e.lock)


def test_a_client_that_does_not_read_is_not_answered_without_end(tmp_path: Path) -> None:
    """A client that pipelines requests and reads none of the answers (a ping is
    ~20 bytes asked, ~150 answered; a ps of 10,000 rows several MB) is not read
    on once its unsent answers pass the full server's high-water mark: the early
    server's memory stays bounded, and the rest of its requests wait, unread, for
    the full server, which answers them as fast as the client takes them."""
    state = tmp_path / "state"
    (state / "sessions").mkdir(parents=True)
    config = EarlyConfig(state, tmp_path / "sock" / "s.sock", True, 0.0)
    lock = os.open(state / "sessiond.lock", os.O_RDWR | os.O_CREAT, 0o600)
    e = open_server(config, lock)
    pings = 20_000  # ~3 MB of answers, several times what the kernel buffers
    request = b'{"id":1,"method":"ping","params":{}}\n'
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(config.socket))
    sender = threading.Thread(target=lambda: _send_all(client, request * pings))
    sender.start()

    def stopped_reading() -> bool:
        # every ping answered (what an unbounded server does), or the connection
        # no longer read (what a bounded one does)
        conns = list(e._conns.values())
        return e.answered == pings or any(getattr(c, "paused", False) for c in conns)

    deadline = time.monotonic() + 120  # a guard against a hang, not a timing
    while not stopped_reading():
        assert time.monotonic() < deadline, "the early server neither answered nor paused"
        time.sleep(0)  # (yield the GIL to the server's thread)
    listening, held = e.hand_over()
    with client, listening:
        assert len(held) == 1
        # a ping answer's bytes past the high-water mark, at most
        assert len(held[0].unsent) < (1 << 16) + 256
        assert e.answered < pings
        left = pings * len(request) - len(held[0].unread) - e.answered * len(request)
        rest = held[0].unread + received(held[0].sock, left)
        assert rest == request * (pings - e.answered)
        sender.join()  # nothing lost: every request it sent is the full server's to answer
        held[0].sock.close()
        os.close(e.lock)


def _send_all(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # (the test closes it once done)
        sock.sendall(data)


def received(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes the client sent that the server did not read yet."""
    sock.setblocking(True)
    sock.settimeout(120)  # a guard against a hang (bytes lost), not a timing
    got = bytearray()
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        assert chunk, "the client's requests ended early"
        got += chunk
    return bytes(got)


def test_a_client_that_reads_gets_every_answer_past_the_high_water_mark(
    tmp_path: Path,
) -> None:
    """Paused while its answers wait, a connection is read on as the client takes
    them: every pipelined ping is answered, in order, then the show is held."""
    state = tmp_path / "state"
    (state / "sessions").mkdir(parents=True)
    config = EarlyConfig(state, tmp_path / "sock" / "s.sock", True, 0.0)
    lock = os.open(state / "sessiond.lock", os.O_RDWR | os.O_CREAT, 0o600)
    e = open_server(config, lock)
    pings = 5_000  # ~750 KB of answers: past the high-water mark many times
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(config.socket))
    requests = b"".join(b'{"id":%d,"method":"ping","params":{}}\n' % n for n in range(pings))
    show = b'{"id":"s","method":"show","params":{"name":"a"}}\n'
    sender = threading.Thread(target=lambda: _send_all(client, requests + show))
    sender.start()
    with client, client.makefile("rb") as answers:
        ids = [orjson.loads(answers.readline())["id"] for _ in range(pings)]
        sender.join()
        listening, held = e.hand_over()
    with listening:
        assert ids == list(range(pings))
        assert e.answered == pings
        assert (len(held), held[0].unsent) == (1, b"")
        # the show, held where the early server read it (or still in the socket)
        unread = held[0].unread
        assert unread + received(held[0].sock, len(show) - len(unread)) == show
        held[0].sock.close()
        os.close(e.lock)


class _OutOfDescriptors(socket.socket):
    """A listening socket whose accept fails as a process out of descriptors does."""

    def accept(self) -> tuple[socket.socket, Any]:
        raise OSError(errno.EMFILE, "Too many open files")


def test_out_of_descriptors_it_stops_accepting_rather_than_spin(tmp_path: Path) -> None:
    """A full descriptor table leaves the listener ready for ever: the early
    thread would take every wake-up on it and spin (holding the GIL the daemon's
    imports need). It stops accepting instead; the backlog keeps the connection
    for the full server, which takes the listening socket over."""
    listening = _OutOfDescriptors(socket.AF_UNIX, socket.SOCK_STREAM)
    config = EarlyConfig(tmp_path, tmp_path / "s.sock", True, 0.0)
    e = Early(config, -1, listening, {"sessions": 0, "rows": [], "read": None})
    try:
        e._selector.register(listening, selectors.EVENT_READ)
        e._accept()
        with pytest.raises(KeyError):
            e._selector.get_key(listening)  # no longer watched
    finally:
        for closing in (listening, e._wake_r, e._wake_w, e._selector):
            closing.close()


@pytest.mark.parametrize("collecting", [True, False])
@pytest.mark.parametrize("fails", [False, True])
def test_the_index_is_read_with_the_cyclic_collector_off_then_it_is_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collecting: bool, fails: bool
) -> None:
    """The read keeps every container it makes: the collector only walks them, so
    it is off meanwhile; after, on or off as before (an error included)."""
    import gc

    import sessiond.ipc.early as early_module

    seen: list[bool] = []
    from sessiond.table.indexfile import read_checked

    def watched(*args: Any) -> Any:
        seen.append(gc.isenabled())
        if fails:
            raise OSError(errno.EIO, "the index could not be read")
        return read_checked(*args)

    monkeypatch.setattr(early_module, "read_checked", watched)
    state = tmp_path / "state"
    (state / "sessions").mkdir(parents=True)
    config = EarlyConfig(state, tmp_path / "sock" / "s.sock", True, 0.0)
    lock = os.open(state / "sessiond.lock", os.O_RDWR | os.O_CREAT, 0o600)
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        if fails:
            with pytest.raises(OSError, match="could not be read"):
                open_server(config, lock)
        else:
            e = open_server(config, lock)
            e.close(None)
        assert seen == [False]
        assert gc.isenabled() == collecting
        if collecting and not fails:  # what the read made, out of the collector's way
            assert gc.get_freeze_count() > 0
    finally:
        (gc.enable if was else gc.disable)()
        if fails:
            os.close(lock)


# None terminated: the usual table, whose listings without filters skip the
# per-row checks (Early._ps_pieces); the answers must stay the full server's
LIVE: list[dict[str, Any]] = [
    {"name": f"s{n:03d}", "state": ("sleeping", "running", "blocked")[n % 3],
     "agent": f"a{(7 * n) % 5}", "last_active": stamp(n), "priority": n % 4, "labels": {}}
    for n in range(60)
]  # fmt: skip


@pytest.mark.parametrize("sort", ["agent", "name", "state", "last-active", "priority"])
@pytest.mark.parametrize("every", [False, True])
@pytest.mark.parametrize("footer", [False, True])
def test_ps_without_filters_is_the_full_servers_answer(
    sort: str, every: bool, footer: bool
) -> None:
    listening, other = socket.socketpair()
    config = EarlyConfig(Path("/nonexistent"), Path("/nonexistent.sock"), True, 0.0)
    rows = sorted(({**r, "boundary": "sandbox"} for r in LIVE), key=lambda r: r["name"])
    e = Early(config, -1, listening, {"sessions": len(rows), "rows": rows, "read": None})  # type: ignore[typeddict-item]
    try:
        listing = Listing.of(all=every, sort=sort)
        for _ in range(2):  # made, then sent again as made
            assert e.ps_result(listing, footer) == full(rows, listing, footer)
    finally:
        for closing in (listening, other, e._wake_r, e._wake_w, e._selector):
            closing.close()


def test_a_ps_answer_waits_as_the_rows_made_once_not_a_copy(early: Early) -> None:
    """A ps answer of 10,000 rows is several MB: it waits to be sent as the very
    bytes made for its listing (each copy of it cost the first answer ~1-2 ms,
    most of it faulting in fresh pages), and what a send takes in part is kept as
    a view of the rest."""
    from sessiond.ipc.early import _Conn

    a, b = socket.socketpair()
    with a, b:
        c = _Conn(a)
        c.examiner = _Admitted()  # type: ignore[assignment]
        request = b'{"id":7,"method":"ps","params":{}}\n'
        pieces = early._answer(c, request)
        assert pieces is not None
        rows = early._answers[Listing()][1]
        assert any(p is rows for p in pieces)
        c.out.queue(pieces)
        answer = b"".join(pieces)
        assert orjson.loads(answer) == {"id": 7, "ok": True, "result": orjson.loads(rows)}
        assert c.out.size == len(answer)
        for count in (1, len(pieces[0]) - 1, 1, len(rows) // 2):  # in part, across pieces
            c.out.sent(count)
            answer = answer[count:]
            assert (c.out.unsent(), c.out.size) == (answer, len(answer))
        c.out.sent(len(answer))
        assert (c.out.pieces, c.out.size, bool(c.out)) == ([], 0, False)


class _Admitted:
    """An examiner that finds the peer an operator (the real one reads /proc)."""

    def refusal(self) -> None:
        return None
