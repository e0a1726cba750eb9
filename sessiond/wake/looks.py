"""What the watcher looks at: which paths a session watches, and a look at each.

A change is measured by a look (modification time, size, inode), so that a
change of attributes alone (a mode, an ACL) is none. The scans (a session's
baseline at its arming, the catch-up of a new watcher, the reconciliation) take
the paths in the routing's own glob dialect (sessiond.wake.globs): pathlib's
differs. Separate from the watcher (sessiond.wake.watch), which owns the tasks,
the routing and the debounce.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from sessiond.gitrefs import git_folder
from sessiond.table.spec import GitTriggerSpec, SessionSpec, WatchTriggerSpec
from sessiond.wake.armed import Look
from sessiond.wake.globs import match


def watches_files(spec: SessionSpec) -> bool:
    """Has it bound files or a watch trigger (its workspace is watched and scanned)?"""
    return bool(spec.bind.files) or any(isinstance(t, WatchTriggerSpec) for t in spec.trigger)


def git_dirs(spec: SessionSpec) -> list[Path]:
    """The ``.git`` folders of its git triggers."""
    return [git_folder(Path(t.repo)) for t in spec.trigger if isinstance(t, GitTriggerSpec)]


def watch_matches(spec: SessionSpec, rel: str) -> bool:
    """Does one of its watch triggers take this workspace-relative path?"""
    return any(
        isinstance(t, WatchTriggerSpec) and match(rel, t.paths) and not match(rel, t.exclude)
        for t in spec.trigger
    )


def watched(spec: SessionSpec, rel: str) -> bool:
    return rel in spec.bind.files or watch_matches(spec, rel)


def look(st: os.stat_result) -> Look:
    """What a change is measured against: a file's modification time, size and inode
    (a new version renamed over it is a new inode, even when its tool kept the time
    and the size; a mode or ACL changes none of them). A folder's inode alone: its
    time moves with each entry added or removed, which is reported for the entry."""
    if stat.S_ISDIR(st.st_mode):
        return (0, 0, st.st_ino)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _stat(entry: os.DirEntry[str]) -> os.stat_result | None:
    try:
        return entry.stat()  # one look: one deleted meanwhile is just not there
    except OSError:
        return None


def candidates(
    base: Path, pattern: str, want: Callable[[str], bool]
) -> Iterator[tuple[str, os.stat_result]]:
    """The paths under ``base`` (workspace-relative, with their stat) that ``pattern``
    may cover and ``want`` takes: from the pattern's literal leading folders down,
    as deep as it reaches (anywhere under a folder named alone or past a ``**``).
    ``want`` is the routing's own glob dialect; pathlib's differs (its ``src/**``
    is folders only, and a folder named alone is not gone into)."""
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    fixed: list[str] = []
    for part in parts:
        if "*" in part or "?" in part:
            break
        fixed.append(part)
    rest = parts[len(fixed) :]
    depth = None if not rest or any("**" in p for p in rest) else len(rest)
    top_rel = "/".join(fixed)
    top = os.path.join(base, top_rel)
    try:
        st = os.stat(top)
    except OSError:
        return
    real = os.path.realpath(base)
    if not inside(real, top):
        return
    if fixed and want(top_rel):
        yield top_rel, st
    if not stat.S_ISDIR(st.st_mode):
        return
    # A symlinked folder is gone into, as the watcher goes into it (a change in its
    # target is reported under the link's path), except one back to a folder above
    # (the watcher passes over such a loop too), and one out of the workspace: a
    # link a run made must not show it what lies outside (``inside``).
    folders = [(top, top_rel, 1, frozenset({(st.st_dev, st.st_ino)}))]
    while folders:
        folder, rel, level, above = folders.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:  # unreadable, or gone meanwhile: what it holds is not there
            continue
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if path == ".git":
                continue  # the git trigger's, never watched (route)
            if entry.is_symlink() and not inside(real, entry.path):
                continue
            if want(path) and (look := _stat(entry)) is not None:
                yield path, look
            if depth is not None and level >= depth:
                continue
            if entry.is_dir(follow_symlinks=False) or entry.is_symlink():
                inner = _stat(entry)  # (cached by the entry when it was looked at above)
                if inner is None or not stat.S_ISDIR(inner.st_mode):
                    continue
                if (inode := (inner.st_dev, inner.st_ino)) not in above:
                    folders.append((entry.path, path, level + 1, above | {inode}))


def inside(workspace: str, path: str) -> bool:
    """Is ``path``, every link on its way followed, in the ``workspace`` (a real
    path)? A run may link anything into its workspace, and the daemon, which sees
    more than the run may (another uid, the sandbox's view), must not report a
    change out there to it: names and times of another session's files, say."""
    real = os.path.realpath(path)
    return real == workspace or real.startswith(workspace.rstrip("/") + "/")


def scan(spec: SessionSpec) -> dict[str, Look]:
    """A look at every path the session watches (what the routing would take)."""
    found: dict[str, Look] = {}
    patterns = list(spec.bind.files)
    for trig in spec.trigger:
        if isinstance(trig, WatchTriggerSpec):
            patterns += trig.paths
    for pattern in patterns:
        for rel, st in candidates(spec.workspace, pattern, functools.partial(watched, spec)):
            found.setdefault(rel, look(st))
    return found
