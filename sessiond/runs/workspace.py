"""The workspace as a run sees it: file hashes, git HEAD, redaction, text diffs.

Pure helpers, with no state of their own: starting a command run, finishing it,
the SDK's tool calls, recovery and the gate report all read the workspace the
same way, so they share these instead of each other.
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from sessiond.gitrefs import resolve
from sessiond.redaction import redactor
from sessiond.table.sessions import file_hash
from sessiond.table.spec import SessionSpec

DIFF_LIMIT = 1 << 20  # files larger than this get no text diff


def workspace_hasher(spec: SessionSpec | None) -> Callable[[str], str | None]:
    base = spec.workspace if spec is not None else Path("/")

    def hasher(path: str) -> str | None:
        inside = within(base, path)
        return file_hash(inside) if inside is not None else None

    return hasher


def within(base: Path, rel: str) -> Path | None:
    """``base / rel`` with its symlinks resolved, when that stays in ``base``; None
    when it leads out. What a run says it writes is read by the daemon (as root,
    often): a symlink the run made in its workspace must not make that read
    another file (a key, another session's workspace)."""
    root = os.path.realpath(base)
    real = os.path.realpath(os.path.join(root, rel))
    return Path(real) if real == root or real.startswith(root.rstrip("/") + "/") else None


def read_in(base: Path, rel: str) -> bytes | None:
    """``read_small`` of ``rel`` in the workspace ``base`` (None when it leads out)."""
    inside = within(base, rel)
    return read_small(inside) if inside is not None else None


def git_head(path: Path) -> str | None:
    """The workspace's git HEAD commit, if it is in a repository, read from the files
    under ``.git`` only: the run writes them (``.git/config`` too), and a ``git``
    the daemon started there would be the run's to steer. None where the files
    cannot say (a worktree, an unborn branch)."""
    return resolve(path, "HEAD", ask_git=False)


def redact(data: bytes, patterns: list[str]) -> bytes:
    """Mask the spec's ``redact`` patterns before anything is stored (compiled once:
    sessiond.redaction)."""
    r = redactor(patterns)
    return r.data(data) if r is not None else data


def read_small(path: Path) -> bytes | None:
    """A regular file's bytes, or None when it is missing, unreadable, not a regular
    file or too big to diff. Opened without waiting and checked before it is read:
    a FIFO would hold the open, a device never end (see ``file_hash``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > DIFF_LIMIT:
                return None
            return f.read(DIFF_LIMIT + 1)
        except OSError:
            return None


def text_diff(before: dict[str, bytes | None], after_root: Path) -> bytes:
    out: list[str] = []
    for rel, old in sorted(before.items()):
        new = read_in(after_root, rel)
        if old == new:
            continue
        try:
            a = (old or b"").decode().splitlines(keepends=True)
            b = (new or b"").decode().splitlines(keepends=True)
        except UnicodeDecodeError:
            out.append(f"Binary file {rel} changed\n")
            continue
        out.extend(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}"))
    return "".join(out).encode()
