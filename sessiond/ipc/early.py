"""The early server: ``ping`` and ``ps`` answered from the table index while the
daemon is still importing and loading (sessiond.daemon.early starts it; the
full server takes it over, sessiond.ipc.server).

What it answers, and to whom (anything else is held for the full server):

- only peers whose uid the full server always admits (the daemon's own, root);
- ``ping``, with no params;
- ``ps`` with its params exactly as the full server takes them, when the index
  vouches for every session (else the full server answers it, once the sessions
  the index did not vouch for are recovered), and only to a peer the run
  examiner finds to be an operator (sessiond.ipc.runpeer): a run's program, or a
  process that cannot be examined, is held, and the full server gives it its
  answer (only ``ping``), never more.

A held connection stops being read: its request and whatever follows it stay
where they are, and the full server adopts the connection, checks its peer as it
checks any (with the examiner pinned here at accept), and serves it from there.
If the daemon does not start, each held connection is told why and the socket
is removed.

Standard library and orjson only: it serves before the rest is imported.
"""

from __future__ import annotations

import contextlib
import gc
import os
import selectors
import socket
import stat
import struct
import sys
import threading
import time
from operator import itemgetter
from pathlib import Path

import orjson

from sessiond import __version__
from sessiond.errors import SessiondError
from sessiond.ipc.fence import check_folder
from sessiond.ipc.outbox import Outbox
from sessiond.ipc.runpeer import Examiner
from sessiond.listing import DEFAULT_SORT, Listing
from sessiond.table.indexfile import INDEX_NAME, Read, read_checked
from sessiond.wire import Frame, encode, last_word_path

# typing is imported for mypy alone: at run time it costs the first answer ~2 ms,
# and a TypedDict is the dict it types (EarlyConfig: below)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, NamedTuple, TypedDict

    from sessiond.replies import Ping, PsRow
else:
    TypedDict = dict

# The uids runs get when no [run] key says otherwise (sessiond.sandboxconfig's
# DEFAULT_DYNAMIC_UIDS; the daemon checks the validated configuration agrees).
DYNAMIC_UIDS = range(458752, 524288)
SWITCH_INTERVAL = 0.0001  # seconds: see Early.start
SEND_BUFFER = 1 << 23  # bytes asked for (the kernel caps it at net.core.wmem_max)
LINE_LIMIT = 1 << 16  # a longer request than ping's or ps's: the full server reads it
# Answers waiting for a client that does not read them, past which it is not read
# on (as the full server waits for each answer to drain, at asyncio's high-water
# mark): a pipelined ping is ~20 bytes asked for ~150 answered, a ps several MB.
OUT_HIGH = 1 << 16
_CREDS = struct.Struct("3i")  # as ipc/peers.py reads it; that module imports the config (pydantic)
# ps params as the full server's model takes them (sessiond.ipc.params.PsParams)
_PS_LISTS = {"state": 200, "agent": 200, "label": 400}
_PS_KEYS = frozenset({*_PS_LISTS, "all", "sort", "footer"})
_NAME = itemgetter("name")


if TYPE_CHECKING:

    class EarlyConfig(NamedTuple):
        """What serving early needs of the configuration, read as load_config reads it."""

        state_dir: Path
        socket: Path
        sandbox: bool  # [run] sandbox = "on" (ps says each row's boundary)
        clock_offset: float

else:  # the same fields, without typing (tests/test_early_config.py checks they agree)
    from collections import namedtuple

    EarlyConfig = namedtuple("EarlyConfig", "state_dir socket sandbox clock_offset")


class Index(TypedDict):
    sessions: int  # every session, vouched for or not
    rows: list[PsRow] | None  # ps's rows, by name; None: the index does not vouch for all
    read: Read | None  # the read and its check, for the full start (Early.take_read)


# (plain classes, not dataclasses: each dataclass costs this path ~1 ms at import)
class Held:
    """A connection the full server takes over: the bytes it sent that were not
    answered yet (its next request first), answers not yet sent to it, and its
    peer's examiner (None: none was made), pinned to the process that connected
    when it was accepted: pinned anew at the hand-over, seconds later, a process
    that connected, asked and exited could have its pid taken by another (where
    the kernel gives no pidfd for a process gone, the pin is its pid and start
    time), and the request it left would be judged by that one."""

    __slots__ = ("examiner", "sock", "unread", "unsent")

    def __init__(
        self, sock: socket.socket, unread: bytes, unsent: bytes, examiner: Examiner | None = None
    ) -> None:
        self.sock, self.unread, self.unsent = sock, unread, unsent
        self.examiner = examiner


class _Conn:
    __slots__ = ("buf", "examiner", "held", "out", "request_id", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.examiner: Examiner | None = None  # None: a peer only the full server may judge
        self.buf = bytearray()
        self.out = Outbox()  # answers not yet sent
        self.held = False
        self.request_id: Any = None  # of the request it is held on

    @property
    def paused(self) -> bool:
        """Not read on until the client takes the answers it has (OUT_HIGH)."""
        return not self.held and self.out.size >= OUT_HIGH


class Early:
    """The early server of one start: serving on its thread from :meth:`start`
    until :meth:`hand_over` (the full server's) or :meth:`close` (no start)."""

    def __init__(
        self, config: EarlyConfig, lock: int, listening: socket.socket, index: Index
    ) -> None:
        self.config = config
        self.lock = lock  # the state dir's lock (statedir.take_lock): the daemon's from here
        self.listening = listening
        self.started = time.time()
        self.sessions: int = index["sessions"]
        self.rows: list[PsRow] | None = index["rows"]  # None: not all vouched for
        self._index_read: Read | None = index["read"]
        self.answered = 0  # requests answered here (the daemon logs it once it can)
        # ps answers as encoded, by listing: valid while the same terminated rows
        # hide (the only thing that changes with time; see _ps_result)
        self._terminated = [r for r in self.rows or [] if r.get("state") == "terminated"]
        self._answers: dict[Listing, tuple[tuple[bool, ...], bytes, int]] = {}
        self._known_names: bytes | None = None
        self._conns: dict[int, _Conn] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="sessiond-early", daemon=True)
        self._done = False
        self._interval = 0.005  # the switch interval to set back (start saves it)

    # --- the daemon's side ----------------------------------------------------------

    def start(self) -> None:
        # Each system call of an answer (accept, recv, the run examiner's /proc
        # reads, send) gives the GIL up, and taking it back waits for the main
        # thread's imports to drop it: at most this long. Only while this thread
        # waits for it: an idle early server costs the imports nothing.
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.listening.setblocking(False)
        self._wake_r.setblocking(False)
        self._selector.register(self.listening, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()

    def take_read(self) -> Read | None:
        """The index as read and checked here, once (the full start's, which
        then does not read it again); its rows may hold a ``boundary`` key this
        server added, until the full server takes over (the daemon drops it)."""
        read, self._index_read = self._index_read, None
        return read

    def hand_over(self) -> tuple[socket.socket, list[Held]]:
        """Stop serving; give the listening socket and every open connection to
        the full server (blocking: run it off the event loop)."""
        self._stop()
        held = [self._held(c) for c in self._conns.values()]
        self._conns.clear()
        self._selector.close()
        self._done = True
        # the rows and answers are the full server's to make from here on
        self.rows, self._terminated, self._answers, self._known_names = None, [], {}, None
        self.listening.setblocking(True)
        return self.listening, held

    def close(self, why: str | None, *, keep_lock: bool = False) -> None:
        """No start: each connection waiting for an answer is told ``why`` (or
        to retry), the socket goes, and the lock with it (``keep_lock``: the
        daemon's already, it closes it)."""
        if self._done:
            return
        self._stop()
        self._done = True
        said = why or "the daemon did not finish starting; retry"
        for c in self._conns.values():
            if c.examiner is not None:
                c.examiner.close()
            with contextlib.suppress(OSError):
                c.sock.setblocking(True)
                c.sock.settimeout(1.0)  # a client that does not read is not waited for
                if c.out:
                    c.sock.sendall(c.out.unsent())
                if c.held:
                    c.sock.sendall(encode(_failure(c.request_id, said)))
            c.sock.close()
        self._conns.clear()
        self._selector.close()
        self.listening.close()
        with contextlib.suppress(OSError):
            os.unlink(self.config.socket)
        if not keep_lock:
            os.close(self.lock)

    def _stop(self) -> None:
        sys.setswitchinterval(self._interval)  # as it was before the early server
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        self._thread.join()
        self._wake_r.close()
        self._wake_w.close()
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self.listening)

    def _held(self, c: _Conn) -> Held:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(c.sock)
        c.sock.setblocking(True)
        # the examiner goes with it: the full server judges the same process, pinned
        # at accept (its verdict so far, a refusal included, stays the connection's)
        return Held(c.sock, bytes(c.buf), c.out.unsent(), c.examiner)

    # --- the thread -----------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping:
            for key, events in self._selector.select():
                if key.fileobj is self._wake_r:
                    return
                if key.fileobj is self.listening:
                    self._accept()
                    continue
                c = self._conns.get(key.fd)
                if c is None:
                    continue
                try:
                    if events & selectors.EVENT_WRITE:
                        self._flush(c)
                    if events & selectors.EVENT_READ:
                        self._read(c)
                except OSError:
                    self._drop(c)
                except Exception:  # a bug here: the full server answers this one
                    self._hold(c, c.request_id)
                    with contextlib.suppress(KeyError, ValueError):
                        self._selector.unregister(c.sock)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors: the listener would be ready again at once and
                # the thread would spin (asyncio pauses its accepts a second here).
                # Stop accepting: the backlog keeps the rest for the full server.
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(self.listening)
                return
            sock.setblocking(False)
            # room for a whole ps answer (several MB at 10,000 rows): each send
            # the kernel takes in part is one more wait for the GIL (the imports')
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            c = _Conn(sock)
            with contextlib.suppress(OSError, ValueError):
                pid, uid, _gid = _CREDS.unpack(
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
                )
                if uid in (os.getuid(), 0):  # whom the full server always lets in
                    c.examiner = Examiner(sock, pid, uid, DYNAMIC_UIDS)
            self._conns[sock.fileno()] = c
            if c.examiner is None:
                c.held = True  # the full server checks it, and says what it may do
            else:
                self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._drop(c)  # gone (a half-sent request is dropped, as the full server does)
            return
        c.buf += data
        self._flush(c)

    def _answer_lines(self, c: _Conn) -> bool:
        """Answer the whole requests read, until one is held or the answers not
        yet sent reach OUT_HIGH; whether any was answered."""
        answered = False
        while not c.held and not c.paused:
            end = c.buf.find(b"\n")
            if end < 0:
                if len(c.buf) > LINE_LIMIT:
                    self._hold(c, None)
                break
            answer = self._answer(c, bytes(c.buf[: end + 1]))
            if answer is None:
                break  # held: the request stays first in what the full server reads
            del c.buf[: end + 1]
            c.out.queue(answer)  # as made: the rows of a ps are not copied (ipc.outbox)
            self.answered += 1
            answered = True
        return answered

    def _flush(self, c: _Conn) -> None:
        while True:
            if c.out:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    c.out.send(c.sock)
            # the requests already read, as far as the client takes their answers
            if not self._answer_lines(c) or c.paused:
                break
        # read on only while the client takes its answers: one that sends without
        # reading is not answered into this process's memory without end
        reading = not c.held and not c.paused
        want = (selectors.EVENT_READ if reading else 0) | (selectors.EVENT_WRITE if c.out else 0)
        registered = _known(self._selector, c)
        if want and registered:
            self._selector.modify(c.sock, want)
        elif want:
            self._selector.register(c.sock, want)
        elif registered:
            self._selector.unregister(c.sock)

    def _hold(self, c: _Conn, request_id: Any) -> None:
        c.held = True
        c.request_id = request_id

    def _drop(self, c: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(c.sock)
        self._conns.pop(c.sock.fileno(), None)
        if c.examiner is not None:
            c.examiner.close()
        c.sock.close()

    def _answer(self, c: _Conn, line: bytes) -> list[bytes] | None:
        """The answer to one request line, in pieces, or None (the connection is held)."""
        if not line.strip():
            return []
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError:
            request = None
        if not isinstance(request, dict):
            self._hold(c, None)
            return None
        request_id = request.get("id")
        if not isinstance(request_id, int | str) or isinstance(request_id, bool):
            request_id = None
        method, params = request.get("method"), request.get("params", {})
        if method == "ping" and params == {}:
            return [encode({"id": request_id, "ok": True, "result": self._ping()})]
        if method == "ps" and self.rows is not None and isinstance(params, dict):
            asked = _ps_params(params)
            assert c.examiner is not None  # (held at accept otherwise)
            if asked is not None and c.examiner.refusal() is None:
                head = encode({"id": request_id, "ok": True})[:-2]  # as encode() frames it
                return [head + b',"result":', *self._ps_pieces(*asked), b"}\n"]
        self._hold(c, request_id)
        return None

    def _ping(self) -> Ping:
        # as sessiond.syscalls.inspection answers it
        return {
            "version": __version__,
            "protocol": 1,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 3),
            "sessions": self.sessions,
            "state_dir": str(self.config.state_dir),
        }

    def ps_result(self, listing: Listing, footer: bool) -> bytes:
        """A ps answer's result, encoded: as sessiond.syscalls.kernel's ps_listed
        makes it, on the rows the index vouches for."""
        return b"".join(self._ps_pieces(listing, footer))

    def _ps_pieces(self, listing: Listing, footer: bool) -> list[bytes]:
        """:meth:`ps_result` in the pieces it is sent as. The rows do not change
        here; what a listing keeps changes only with which terminated rows hide
        now, so its rows are encoded once and sent again while those stay the same."""
        assert self.rows is not None
        now = (time.time_ns() + int(self.config.clock_offset * 1e9)) / 1e9
        hides = tuple(listing.hides(r, now) for r in self._terminated)
        known = self._answers.get(listing)
        if known is None or known[0] != hides:
            if listing.states or listing.agents or listing.labels or self._terminated:
                kept, hidden = listing.apply(self.rows, now)
            else:
                # what apply gives when every row matches and none is terminated
                # (none hides): the rows in the listing's order, without asking
                # each of 10,000 rows twice (3-4 ms of the first answer)
                kept, hidden = _ordered(listing, self.rows), 0
            # every key is a str (each row was decoded from JSON; boundary is ours),
            # so these are the bytes the full server's OPT_NON_STR_KEYS writes: that
            # option's path costs 3-4x (15 ms for 10,000 rows, before the first answer)
            rows = orjson.dumps(kept)
            known = (hides, rows, hidden)
            if len(self._answers) < 16:  # the usual listings; any other is made each time
                self._answers[listing] = known
        if not footer:
            return [known[1]]
        # {"rows": …, "hidden": …, "known": …} as orjson writes that dict
        return [b'{"rows":', known[1], b',"hidden":%d,"known":' % known[2], self._names(), b"}"]

    def _names(self) -> bytes:
        if self._known_names is None:
            assert self.rows is not None
            self._known_names = orjson.dumps([r["name"] for r in self.rows])
        return self._known_names


def _ordered(listing: Listing, rows: list[PsRow]) -> list[PsRow]:
    """``listing.order(rows)`` for ``rows`` in name order (Index's): its first
    sort, by name, is theirs already; the usual listing's, by agent, is then
    the only one (Listing.order's key; tests/ipc/test_early.py compares both)."""
    if listing.sort == "agent":
        return sorted(rows, key=lambda r: r.get("agent") or "")
    return listing.order(rows)


def _known(selector: selectors.BaseSelector, c: _Conn) -> bool:
    try:
        selector.get_key(c.sock)
    except KeyError:
        return False
    return True


def _ps_params(params: Mapping[str, object]) -> tuple[Listing, bool] | None:
    """A ps request's params as the full server's model takes them (strict), or
    None: anything it would refuse or read otherwise is the full server's to answer."""
    if not params.keys() <= _PS_KEYS:
        return None
    lists: dict[str, list[str]] = {}
    for key, longest in _PS_LISTS.items():
        value = params.get(key, [])
        if type(value) is not list or len(value) > 64:
            return None
        if not all(type(v) is str and len(v) <= longest for v in value):
            return None
        lists[key] = value
    every, footer, sort = (
        params.get("all", False),
        params.get("footer", False),
        params.get("sort", DEFAULT_SORT),
    )
    if type(every) is not bool or type(footer) is not bool:
        return None
    if type(sort) is not str or len(sort) > 32:
        return None
    try:
        listing = Listing.of(lists["state"], lists["agent"], lists["label"], every, sort)
    except ValueError:
        return None
    return listing, footer


def _failure(request_id: Any, why: str) -> Frame:
    return {
        "id": request_id,
        "ok": False,
        # as no daemon on the socket (docs/rpc.md, "Errors"): nothing was done
        "error": {
            "code": "unreachable",
            "message": f"sessiond did not start: {why}; nothing was done",
            "exit": 3,
        },
    }


def _rows(state_dir: Path, sandbox: bool) -> Index:
    """The index read and checked against the logs: every session's ps row, when
    the index vouches for all (sessiond.table.indexfile)."""
    read = read_checked(state_dir / INDEX_NAME, state_dir / "sessions")
    planned = read.planned
    sessions = len(planned["first"]) + len(planned["rest"])
    if planned["first"]:
        return {"sessions": sessions, "rows": None, "read": read}
    boundary = "sandbox" if sandbox else "off"
    rows: list[PsRow] = []
    for e in planned["rest"].values():
        # in place: each row was just parsed and is the early server's alone (a
        # copy of 10,000 rows costs the first answer ~5 ms); the same keys in the
        # same order as {**row, "boundary": boundary}
        row = e["row"]
        row["boundary"] = boundary
        rows.append(row)
    rows.sort(key=_NAME)  # (each name a str: read_index checked it)
    return {"sessions": sessions, "rows": rows, "read": read}


def _listen(path: Path) -> socket.socket:
    """Bind the control socket as the full server does (sessiond.ipc.server):
    an owner-only folder, a stale socket replaced, mode 0600. OSError or
    SessiondError: left to the full server, which reports it."""
    check_folder(path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise SessiondError(f"{path} is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            os.unlink(path)  # left by a crash: nobody listens
        else:
            raise SessiondError(f"another daemon is listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(4096)  # the full server sets its own backlog when it takes over
    except OSError:
        sock.close()
        raise
    last_word_path(path).unlink(missing_ok=True)
    return sock


def open_server(config: EarlyConfig, lock: int) -> Early:
    """Read the index, bind the socket, serve. Any error: nothing was started, the
    socket is not left bound (the full start reports what is wrong)."""
    # The read makes several containers per session, all kept (the full start
    # takes them over), and no cyclic garbage: the cyclic collector would walk them
    # again and again as they are made, for nothing (20-30 ms of the first answer
    # at 10,000 sessions; the daemon's load turns it off for the same reason).
    collecting = gc.isenabled()
    gc.disable()
    try:
        index = _rows(config.state_dir, config.sandbox)
        if collecting:
            # and once it is back on, its first collection would walk them all
            # once more (7 ms, just before the first answer): what is alive now
            # lives as long as the daemon, or goes by its count (nothing here is
            # cyclic), so it is frozen out of the collector's way now, as the
            # daemon freezes what it loads once loaded (sessiond.daemon.opening)
            gc.freeze()
        listening = _listen(config.socket)
        try:
            early = Early(config, lock, listening, index)
            if early.rows is not None:  # the answers of `ps` and `sessionctl ps`, made
                early._ps_pieces(Listing(), footer=True)  # before the imports want the GIL
        except BaseException:
            # not served: nobody listens on the socket (the full server binds it anew)
            listening.close()
            with contextlib.suppress(OSError):
                os.unlink(config.socket)
            raise
    finally:
        if collecting:
            gc.enable()
    early.start()
    return early
