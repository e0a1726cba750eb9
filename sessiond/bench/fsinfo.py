"""Which file system a folder is on, and how long an fsync takes there.

Group-commit figures mean nothing on tmpfs (fsync is free there), so the
benchmark reports both beside its figures.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path


def fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (from /proc/self/mountinfo)."""
    target = str(path.resolve())
    best, best_type = "", "unknown"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                mount_point = left.split()[4].replace("\\040", " ")
                prefix = mount_point.rstrip("/") + "/"
                inside = target == mount_point or target.startswith(prefix)
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, right.split()[0]
    except OSError:
        pass
    return best_type


def fsync_median_ms(folder: Path, samples: int = 50) -> float:
    """Median latency of write(64 bytes) + fsync in ``folder``."""
    path = folder / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(samples):
            os.write(fd, b"x" * 63 + b"\n")
            start = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1000
