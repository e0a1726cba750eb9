"""Benchmark of the resume gate on a session whose continuation needs 1,000 artifacts.

The gate runs at every wake, so its storage checks must stay cheap however much
evidence a session holds: "log intact" reads only the lines written since the
last gate, "artifacts intact" re-reads only artifacts whose inode, size, mtime
or ctime changed (sessiond/log/store/hashcache.py). Measured as the daemon does
it (runs/continuation.py ``gate_now`` without its append): the log's
``verify()``, then ``evaluate`` with the store's artifact check.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from sessiond.codec import rfc3339
from sessiond.log.event_data import SessionMerged, WakeRequested
from sessiond.log.journal import Journal
from sessiond.log.store.files import FileStore
from sessiond.log.store.hashcache import RACY_NS
from sessiond.runs.workspace import workspace_hasher
from sessiond.table.gate import GateVerdict, evaluate
from sessiond.table.spec import parse_spec

SPEC = 'name = "evidence"\n[run]\nexec = ["true"]\n[[trigger]]\ntype = "message"\n'


async def gate_ms(
    folder: Path, artifacts: int = 1000, repeats: int = 200, size: int = 4096
) -> tuple[float, float, float]:
    """(median ms of a gate with everything unchanged, ms of the first gate, which
    hashes every artifact, median ms of the floor). Each timed gate follows one
    append (a wake), so the log check has a line to verify, as at a real wake.

    The floor is what no cache can avoid, measured alternately with the gate: one
    stat of each artifact by name in its folder (how else would a changed file
    show?). On a shared machine the ratio says more than either figure."""
    store = FileStore(folder)
    await (await store.create("evidence")).close()
    journal = await Journal.open(store, "evidence", durability="os", snapshot_every=1 << 62)
    files = store.artifacts("evidence")
    # Merged children's results stay in the messages view: continuing needs them.
    per_merge = 10
    for m in range(artifacts // per_merge):
        refs = tuple(files.put(os.urandom(size), f"result-{m}-{i}.txt") for i in range(per_merge))
        await journal.append(SessionMerged(child=f"child-{m}", summary=f"part {m}", artifacts=refs))
    spec = parse_spec(SPEC, base=folder)
    hash_file = workspace_hasher(spec)

    def one() -> GateVerdict:
        state = journal.state
        damaged = store.artifacts("evidence").verify_many(state.live_artifacts())
        return evaluate(
            state,
            spec,
            now=rfc3339(time.time_ns()),
            hash_file=hash_file,
            log_error=journal.log.verify(),
            check_artifact=damaged.get,
        )

    names = [ref[7:] for ref in journal.state.live_artifacts()]
    assert len(names) == artifacts

    def floor() -> None:
        dir_fd = os.open(files.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in names:
                os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(dir_fd)

    start = time.perf_counter()
    verdict = one()
    cold = (time.perf_counter() - start) * 1000
    assert verdict.ok, verdict.failing()
    # A hash taken within RACY_NS of a file's last change is not remembered (file
    # times tick coarsely); let the fresh artifacts age past it, as any real
    # artifact has by its next gate.
    time.sleep(RACY_NS / 1e9)
    one()
    times, floors = [], []
    for _ in range(repeats):
        await journal.append(WakeRequested(trigger="message"))  # durability os: no wait
        start = time.perf_counter()
        verdict = one()
        times.append((time.perf_counter() - start) * 1000)
        assert verdict.ok, verdict.failing()
        start = time.perf_counter()
        floor()
        floors.append((time.perf_counter() - start) * 1000)
    await journal.close()
    return statistics.median(times), cold, statistics.median(floors)
