"""Durable appends from many clients at once, beside the disk's own concurrency.

``send_4x4_eps``: four clients, each on a connection of its own, each sending
messages one after the other to a session of its own (four sessions) of a
running daemon; every answer waits for its ``message.received`` to be durable.
``fsync_4_loops_eps``: the floor, four threads each appending a line to a file of
its own and fsyncing it, in a loop, on the same disk (what four logs that sync
concurrently can reach at best). Measured alternately, in the same run.
``send_4x4_ratio`` is the first over the second: target >= 0.7.

The clients are four processes, and so is the floor: four fsync loops in four
processes. Four real clients are four ``sessionctl`` processes; four threads of
one Python process (the first form of this bench) share one GIL, and their
Python between two sends (the encoding, the socket calls, the thread switches)
is serialised with the other three's and counted against the daemon. The floor
moves with them so that the ratio still compares like with like: the fsync
loops pay the same process boundary, none of a GIL. The thread form is still
measured, alternately in the same run, as ``send_4x4_threads_eps`` beside
``fsync_4_loops_threads_eps`` (``send_4x4_threads_ratio``), to compare with the
figures taken before.

``--commits-only`` (``alone``): these, with every other figure of a commit beside
its floor, in one run: the step beside one SQLite commit (bench/steps.py), group
commit beside fsync-each and replay beside its read-and-parse floor
(bench/storage.py).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sessiond.bench import fsinfo, run_async, steps, storage
from sessiond.bench.daemon import BenchDaemon, call
from sessiond.wire import Connection

CLIENTS = 4


def _together(work: Callable[[int], int], seconds: float) -> float:
    """``work(i)`` in CLIENTS threads at once, each until the deadline; ops/s in all."""
    counts = [0] * CLIENTS
    deadline = time.perf_counter() + seconds
    barrier = threading.Barrier(CLIENTS + 1)

    def one(i: int) -> None:
        barrier.wait()
        n = 0
        while time.perf_counter() < deadline:
            n += work(i)
        counts[i] = n

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def _in_processes(setup: Callable[[int], Callable[[], int]], seconds: float) -> float:
    """``setup(i)()`` in CLIENTS forked processes at once, each for ``seconds`` after
    they all stand ready; ops/s in all (each process's count over its own time)."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(CLIENTS + 1)
    rates = ctx.Array("d", CLIENTS)

    def one(i: int) -> None:
        work = setup(i)  # opened in the child: nothing shared across the fork
        barrier.wait()
        start = time.perf_counter()
        deadline = start + seconds
        n = 0
        while time.perf_counter() < deadline:
            n += work()
        rates[i] = n / (time.perf_counter() - start)

    procs = [ctx.Process(target=one, args=(i,)) for i in range(CLIENTS)]
    for p in procs:
        p.start()
    barrier.wait()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a bench client process exited with {p.exitcode}")
    return float(sum(rates[:]))


LINE = b"x" * 300 + b"\n"  # about a message.received line


def _fsync_loop(folder: Path, i: int) -> Callable[[], int]:
    fd = os.open(folder / f"proc{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def work() -> int:
        os.write(fd, LINE)
        os.fsync(fd)
        return 1

    return work


def fsync_loops_procs_eps(folder: Path, seconds: float) -> float:
    """The floor of the process form: four processes each appending and fsyncing."""
    return _in_processes(lambda i: _fsync_loop(folder, i), seconds)


def sends_procs_eps(socket: Path, seconds: float) -> float:
    """Four processes each sending to its own session on a connection of its own."""

    def client(i: int) -> Callable[[], int]:
        conn = Connection(socket)

        def send() -> int:
            conn.call("send", {"to": f"notes{i}", "text": "a note of about the size of one"})
            return 1

        return send

    return _in_processes(client, seconds)


def fsync_loops_eps(folder: Path, seconds: float) -> float:
    fds = [
        os.open(folder / f"loop{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for i in range(CLIENTS)
    ]
    line = LINE

    def work(i: int) -> int:
        os.write(fds[i], line)
        os.fsync(fds[i])
        return 1

    try:
        return _together(work, seconds)
    finally:
        for fd in fds:
            os.close(fd)


def measure(work: Path, quick: bool, seconds: float | None = None) -> dict[str, float]:
    root = (work / "commits").resolve()
    root.mkdir()
    d = BenchDaemon(root)
    d.state_dir.mkdir(parents=True)
    floors, sends, t_floors, t_sends = [], [], [], []
    try:
        d.start()
        for i in range(CLIENTS):
            spec = f'name = "notes{i}"\ngoal = "take notes"\n'
            call(d.socket, "create", {"spec": spec, "base": str(root), "source": "commits"})
        conns = [Connection(d.socket) for _ in range(CLIENTS)]

        def send(i: int) -> int:
            conns[i].call("send", {"to": f"notes{i}", "text": "a note of about the size of one"})
            return 1

        seconds = seconds or (1.5 if quick else 4.0)
        for _ in range(3 if quick else 5):
            floors.append(fsync_loops_procs_eps(root, seconds))
            sends.append(sends_procs_eps(d.socket, seconds))
            t_floors.append(fsync_loops_eps(root, seconds))
            t_sends.append(_together(send, seconds))
        for conn in conns:
            conn.close()
    finally:
        d.stop()
    shutil.rmtree(root)
    floor, sent = statistics.median(floors), statistics.median(sends)
    t_floor, t_sent = statistics.median(t_floors), statistics.median(t_sends)
    return {
        "send_4x4_eps": round(sent, 1),
        "fsync_4_loops_eps": round(floor, 1),
        "send_4x4_ratio": round(sent / floor, 2),
        "send_4x4_threads_eps": round(t_sent, 1),
        "fsync_4_loops_threads_eps": round(t_floor, 1),
        "send_4x4_threads_ratio": round(t_sent / t_floor, 2),
    }


def alone(work: Path, quick: bool, say: Callable[[str], None]) -> dict[str, object]:
    """The commit figures, each beside its floor, in one run (``--commits-only``)."""
    out: dict[str, object] = {"fs_type": fsinfo.fs_type(work)}
    out["fsync_median_ms"] = round(fsinfo.fsync_median_ms(work), 3)
    say("measuring append_fsync_each_eps, append_group_commit_eps ...")
    (folder := work / "group").mkdir()
    each = storage.fsync_each_eps(folder, seconds=2.0 if quick else 5.0)
    eps, fsyncs = run_async(lambda: storage.group_commit_eps(folder, 32, 3.0 if quick else 8.0))
    out |= {"append_fsync_each_eps": round(each, 1), "append_group_commit_eps": round(eps, 1),
            "group_commit_fsyncs": fsyncs, "group_commit_ratio": round(eps / each, 2)}  # fmt: skip
    say("measuring replay_eps beside replay_floor_eps ...")
    (folder := work / "replay").mkdir()
    replay, floor = run_async(lambda: storage.replay_eps(folder, 200_000, 3 if quick else 7))
    out |= {"replay_eps": round(replay), "replay_floor_eps": round(floor),
            "replay_floor_ratio": round(replay / floor, 2)}  # fmt: skip
    shutil.rmtree(folder)
    say("measuring sdk_step_roundtrip_p50_ms beside its floors, send_4x4_eps beside its ...")
    return {**out, **steps.measure(work, quick), **measure(work, quick)}
