"""``git``: a session wakes when a ref moved and the commits touch its paths.

A change under a repository's ``.git`` (reported by the watcher, see
sessiond.wake.watch) makes the daemon read the ref; if it moved and the diff
from the last commit this session saw touches the trigger's paths, the session
wakes with the commit range.

Separate because it alone keeps state across re-arming and restarts: the
commits each session has seen, in memory and in a durable cursor file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import structlog

from sessiond.gitrefs import git, head_ref, moved_forward, resolve
from sessiond.log.store.durable import write_durable
from sessiond.table.sessions import Session
from sessiond.table.spec import GitTriggerSpec
from sessiond.wake.armed import Armed
from sessiond.wake.globs import match
from sessiond.wake.host import WakeHost, last_wake

log = structlog.get_logger(__name__)

GIT_CURSOR = "git.cursor.json"  # per session: where each git trigger's scan resumes


def _ref(trig: GitTriggerSpec) -> str:
    if trig.ref:
        return trig.ref
    return head_ref(Path(trig.repo)) or "HEAD"


def _key(repo: object, ref: object) -> str:
    """What the seen commits and the cursor are keyed by: ``repo:ref``."""
    return f"{repo}:{ref}"


class GitTriggers:
    """Arms and checks a session's git triggers; a move that matters asks the host
    for a wake."""

    def __init__(self, host: WakeHost) -> None:
        self.host = host
        # Per session, kept across re-arming (every run's end re-arms): the commits
        # seen, and one git check at a time, so that wakes are recorded in commit
        # order and a check in flight is not repeated by the next arming.
        self._seen: dict[str, dict[str, str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def seen(self, name: str) -> dict[str, str]:
        """The commits this session has seen (repo:ref -> commit), shared by every
        arming of it."""
        return self._seen.setdefault(name, {})

    def forget(self, name: str) -> None:
        """The session ended or was removed: nothing of it is kept."""
        self._seen.pop(name, None)
        self._locks.pop(name, None)

    # Where a git trigger's scan starts is durable, so that commits made while the
    # daemon was down still wake the session after a restart. A wake records its
    # range in the log; the cursor file records what the log cannot: the first
    # baseline and commits passed over because they touched no watched path. It
    # is stamped with the session's seq when written; a git wake in the log after
    # that seq wins over it.

    def _cursor_file(self, s: Session) -> Path:
        return Path(self.host.store.sessions_dir) / s.name / GIT_CURSOR

    def _read_cursor(self, s: Session) -> dict[str, object]:  # as read: checked as used
        try:
            found = orjson.loads(self._cursor_file(s).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return found if isinstance(found, dict) else {}

    def _save_cursor(self, armed: Armed) -> None:
        s = armed.session
        # Every wake already in the log is older than this seq; one still being
        # appended will be newer and win over the cursor (rescanning, never skipping).
        after = s.journal.state.seq
        cursor = {key: {"commit": c, "after_seq": after} for key, c in armed.git_seen.items()}
        try:
            write_durable(self._cursor_file(s), orjson.dumps(cursor))
        except OSError as exc:  # the log's last wake still bounds what can be missed
            log.warning("git.cursor_unsaved", session=s.name, error=str(exc))

    # --- arming and checking ----------------------------------------------------------

    def arm(self, armed: Armed, trig: GitTriggerSpec) -> None:
        s = armed.session
        ref = _ref(trig)
        key = _key(trig.repo, ref)
        if key in armed.git_seen:
            return  # armed before: what this daemon has seen is newer than the log
        last = last_wake(self.host, s, "git", lambda d: _key(d.get("repo"), d.get("ref")) == key)
        cursor = self._read_cursor(s).get(key)
        if isinstance(cursor, dict) and (last is None or last["seq"] <= cursor.get("after_seq", 0)):
            armed.git_seen[key] = str(cursor.get("commit") or "")
        elif last is not None:
            armed.git_seen[key] = str(last["data"]["details"]["to"])
        else:  # first arming: start from the tip now, and remember it
            armed.git_seen[key] = resolve(Path(trig.repo), ref) or ""
            if armed.git_seen[key]:
                self._save_cursor(armed)

    def check(self, armed: Armed) -> None:
        """Look for new commits; the git processes run off the event loop."""
        self.host.spawn(self._check_now(armed))

    async def _check_now(self, armed: Armed) -> None:
        spec = armed.session.spec
        assert spec is not None
        async with self._locks.setdefault(armed.session.name, asyncio.Lock()):
            for trig in spec.trigger:
                if not isinstance(trig, GitTriggerSpec):
                    continue
                repo = Path(trig.repo)
                ref = _ref(trig)
                key = _key(trig.repo, ref)
                new = resolve(repo, ref)  # the ref's file: no process on the common path
                old = armed.git_seen.get(key, "")
                if not new or new == old:
                    continue
                armed.git_seen[key] = new
                try:
                    await self._moved(armed, trig, ref, old, new)
                except Exception:
                    # Not recorded (a full disk, a session held, an unreadable object):
                    # the move is looked at again by the next check, not forgotten.
                    armed.git_seen[key] = old
                    log.exception("git.check_failed", session=armed.session.name, to=new)

    async def _moved(
        self, armed: Armed, trig: GitTriggerSpec, ref: str, old: str, new: str
    ) -> None:
        forced, changed_all = await _git_range(Path(trig.repo), old, new)
        changed = [p for p in changed_all if match(p, trig.paths)]
        if not changed:
            log.info("git.ignored", session=armed.session.name, to=new, why="paths untouched")
            self._save_cursor(armed)
            return
        details = {
            "repo": trig.repo, "ref": ref, "from": old, "to": new,
            "range": f"{old}..{new}" if old else new, "forced": forced, "paths": changed,
        }  # fmt: skip
        await self.host.wake(armed.session, "git", details)


# paths as they are (not octal-quoted), as the loose-object diff gives them
_RAW = ("-c", "core.quotepath=off")


async def _paths_of(repo: Path, commit: str) -> str | None:
    """The paths ``commit`` itself changed, one a line."""
    return await asyncio.to_thread(
        git, repo, *_RAW, "show", "--pretty=format:", "--name-only", commit
    )


async def _git_range(repo: Path, old: str, new: str) -> tuple[bool, list[str]]:
    """(was the ref moved other than forward, the paths changed from old to new).

    ``merge-base`` says whether ``old`` is an ancestor of ``new``; ``diff old...new``
    diffs from where the two met, which is ``old`` itself for a move forward and
    the fork point after a rebase, a reset or a force push. The two git processes
    run side by side, off the event loop. Without a common commit: the paths of
    ``new`` itself."""
    if not old:
        names = await _paths_of(repo, new)
        return False, [p for p in (names or "").splitlines() if p]
    forward = await asyncio.to_thread(moved_forward, repo, old, new)  # new commits: no git
    if forward is not None:
        return False, forward
    # A rename counts as both of its paths, as the loose-object diff counts it.
    base, names = await asyncio.gather(
        asyncio.to_thread(git, repo, "merge-base", old, new),
        asyncio.to_thread(
            git, repo, *_RAW, "diff", "--no-renames", "--name-only", f"{old}...{new}"
        ),
    )
    if base is None:  # unrelated histories
        names = await _paths_of(repo, new)
    return base != old, [p for p in (names or "").splitlines() if p]
