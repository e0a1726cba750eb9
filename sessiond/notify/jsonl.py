"""``jsonl://PATH``: a target that appends each notice to a file, one JSON object a
line, with the fields a JSON webhook gets (``notice_id``, ``session``, ``seq``,
``event``, ``link``, ``approve_url``…). It needs no network and no receiver, so
``make run`` shows notifications on any machine (``tail -f state/notices.jsonl``),
and a script can follow the file. A relative PATH is in the state dir;
``jsonl:///abs/path`` is absolute. Each line is written and fsynced before the
cursor moves, like any delivery (sessiond.notify.target).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

import orjson

from sessiond.log.store.durable import write_all
from sessiond.notify.notices import Notice, rendered

SCHEME = "jsonl"


def path_of(url: str, state_dir: Path) -> Path:
    parts = urlsplit(url)
    where = unquote(parts.netloc + parts.path)
    if not where or where.endswith("/"):
        raise ValueError(f"{url}: name a file, e.g. jsonl://notices.jsonl (in the state dir)")
    return Path(where) if where.startswith("/") else state_dir / where


def line(notice: Notice) -> bytes:
    data: dict[str, object] = {
        "notice_id": notice.id,
        "session": notice.session,
        "seq": notice.seq,
        "event": notice.event,
        "event_type": notice.type,
        "ts": notice.ts,
        "title": notice.title,
        "message": rendered(notice),
        "type": notice.level,
        "link": notice.link,
    }
    for label, url in notice.actions:
        data[f"{label}_url"] = url
    return orjson.dumps(data) + b"\n"


def append(path: Path, notice: Notice) -> None:
    """Append the notice's line, durably (blocking: the delivery thread calls it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_NONBLOCK: a FIFO put in the file's place fails at once, never hangs the target
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(path, flags, 0o600)
    try:
        if notice.actions:
            _keeps_links(fd, path)
        write_all(fd, line(notice))
        os.fsync(fd)
    finally:
        os.close(fd)


def _keeps_links(fd: int, path: Path) -> None:
    """A notice with links goes only into a regular file of the daemon's user that
    nobody else may read: its links answer approvals (a bearer credential), and a
    file made beforehand by another user (say, in /tmp) would hand them to it."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise PermissionError(f"{path} is not a regular file; move it away")
    if info.st_uid != os.geteuid():
        raise PermissionError(
            f"{path} belongs to uid {info.st_uid}, not the daemon's: its owner would read the "
            "notices' approve/deny links; remove it (the daemon makes it, owner-only)"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(
            f"{path} is open to others (mode {stat.S_IMODE(info.st_mode):o}) and the notices' "
            f"approve/deny links answer approvals: chmod 600 {path}"
        )
