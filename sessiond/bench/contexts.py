"""Bytes stored for a long agent conversation: each model call's context stored
whole (as before 0.x: one artifact a call) against shared chunks
(sessiond.log.chunks), on the real artifact store.

Call ``n`` of the conversation sends the system prompt and messages ``0..n`` (each
``size`` bytes of text, roles alternating), as an agent that re-sends its history
does. ``context_<N>_whole_bytes`` is what one file a call stores (the sum of the
contexts: O(N²)); ``context_<N>_chunked_bytes`` what the chunks, index chunks
and manifests take (O(N)); ``context_<N>_ratio`` the one over the other.
``*_put_p50_ms`` is the median time to store one call's context (hashing, writes,
fsyncs: in the daemon, in a thread off the loop). ``*_disk_bytes`` are the same
in blocks the file system allocated (each file takes at least one). The whole
store is written only where it stays small; beyond that it is the sum of the
contexts' sizes, which is what it would hold.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

import orjson

from sessiond.log.chunks import put_context
from sessiond.log.store.fileartifacts import FileArtifacts

# past this many calls the whole-copy store is counted, not written (it is O(N²))
WRITE_WHOLE_UPTO = 300


def message(i: int, size: int) -> dict[str, str]:
    text = ("abcdefghijklmnopqrstuvwxyz" * (size // 26 + 2))[i % 26 :][:size]
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: {text}"}


def request(history: list[dict[str, str]]) -> bytes:
    body = {"model": "m", "system": "be brief", "messages": history, "max_tokens": 512}
    return orjson.dumps(body)


def _usage(folder: Path) -> tuple[int, int]:
    sizes = disk = 0
    for path in folder.iterdir():
        st = path.stat()
        sizes += st.st_size
        disk += st.st_blocks * 512
    return sizes, disk


def measure_calls(folder: Path, calls: int, size: int = 1000) -> dict[str, float]:
    whole_dir, chunked_dir = folder / "whole", folder / "chunked"
    whole_dir.mkdir(parents=True)
    chunked_dir.mkdir(parents=True)
    whole, chunked = FileArtifacts(whole_dir), FileArtifacts(chunked_dir)
    whole_bytes = 0
    history: list[dict[str, str]] = []
    whole_ms, chunked_ms = [], []
    for n in range(calls):
        history.append(message(n, size))
        data = request(history)
        whole_bytes += len(data)
        if calls <= WRITE_WHOLE_UPTO:
            start = time.perf_counter()
            whole.put(data, "context.json", "application/json")
            whole_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        put_context(chunked, data, "context.json")
        chunked_ms.append((time.perf_counter() - start) * 1000)
    chunked_bytes, chunked_disk = _usage(chunked_dir)
    out: dict[str, float] = {
        f"context_{calls}_whole_bytes": whole_bytes,
        f"context_{calls}_chunked_bytes": chunked_bytes,
        f"context_{calls}_chunked_disk_bytes": chunked_disk,
        f"context_{calls}_ratio": round(whole_bytes / chunked_bytes, 1),
        f"context_{calls}_chunked_put_p50_ms": round(statistics.median(chunked_ms), 2),
    }
    if calls <= WRITE_WHOLE_UPTO:
        out[f"context_{calls}_whole_disk_bytes"] = _usage(whole_dir)[1]
        out[f"context_{calls}_whole_put_p50_ms"] = round(statistics.median(whole_ms), 2)
    shutil.rmtree(whole_dir)
    shutil.rmtree(chunked_dir)
    return out


def measure(folder: Path, quick: bool) -> dict[str, float]:
    results: dict[str, float] = {}
    for calls in (50, 200) if quick else (50, 200, 1000):
        results.update(measure_calls(folder / str(calls), calls))
    return results
