"""Counting the awaited commits of a wake (the daemon's ``log.commit`` debug lines).

From a request (``send``, ``activate``) to the first instruction of the program it
starts, every commit the daemon waits for is one more disk flush (files) or
PostgreSQL commit (a cluster) in the wake's latency. The daemon logs each sync it
awaits with the types of the events that sync makes durable; these helpers read
those lines between the request and the ``run.started`` line (logged once the
program was let go), so a test asserts the path's commits instead of guessing.
"""

from __future__ import annotations

from tests.e2e.harness import Daemon

# Woken by a message, started once: a command whose contract lets it run again.
WOKEN = """name = "{name}"
[run]
exec = ["sh", "-c", "echo ran >> ran.txt"]
cwd = "."
writes = ["ran.txt"]
side_effect = "read"
idempotency = "safe"

[[trigger]]
type = "message"
"""


def commits_until_exec(d: Daemon, session: str, since: int) -> list[list[str]]:
    """The commits the daemon awaited for ``session`` from log line ``since`` until
    its program was let go: each the types of the events it made durable."""
    started = d.wait_line(
        "run.started", match=lambda line: line.get("session") == session, since=since
    )
    end = d.lines.index(started)
    return [
        list(line["types"])
        for line in d.lines[since:end]
        if line.get("event") == "log.commit" and line.get("session") == session
    ]


def send_and_count(d: Daemon, session: str) -> list[list[str]]:
    """``create`` a message-woken session, then ``send`` it a message: the commits
    awaited between the send and its program's start."""
    d.ctl("create", str(d.write_spec(session, WOKEN.format(name=session))), check=True)
    created = d.wait_line("session.created", match=lambda line: line.get("session") == session)
    since = d.lines.index(created) + 1
    d.ctl("send", session, "go", check=True)
    return commits_until_exec(d, session, since)


def activate_and_count(d: Daemon, session: str) -> list[list[str]]:
    """The same for ``activate`` of a session without triggers."""
    spec = WOKEN.format(name=session).split("[[trigger]]")[0]
    d.ctl("create", str(d.write_spec(session, spec)), check=True)
    created = d.wait_line("session.created", match=lambda line: line.get("session") == session)
    since = d.lines.index(created) + 1
    d.ctl("activate", session, check=True)
    return commits_until_exec(d, session, since)


def flat(commits: list[list[str]]) -> list[str]:
    return [t for c in commits for t in c]
