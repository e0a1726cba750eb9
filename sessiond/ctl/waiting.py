"""``--wait`` for ``activate``, ``start`` and ``restart``: block until the run the
command started has finished, as ``systemctl start --wait`` does for a unit.

Scripts and the README's tour need this: a command that prints what a run did
(``log``, ``models``, ``output``) right after ``activate`` would otherwise race the
run. The wait is a loop of the daemon's ``output`` long poll on that run (each
answer comes when the run prints or ends), so it holds no connection open and
follows the run however long it takes.

The exit code says how the run ended: 0 when it finished ok, 1 otherwise (failed,
killed, timed out, interrupted), and 0 when no run was started (a blocked or
queued session: the printed state says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sessiond.wire import Connection

if TYPE_CHECKING:
    from sessiond.replies import Output, SessionDetail

POLL = 25.0  # seconds one request may wait (the daemon allows 30)


def the_run(d: SessionDetail) -> str | None:
    """The run an activation started, when it started one."""
    current = d.get("current_run")
    if d["state"] != "running" or not current:
        return None
    run = current.get("run")
    return run if isinstance(run, str) else None


def wait_for_run(conn: Connection, name: str, run: str) -> Output:
    """Follow ``run`` of ``name`` until it has finished; its last ``output`` answer
    (with ``status`` and ``exit_code``)."""
    offset = 0
    while True:
        r: Output = conn.call(
            "output",
            {"name": name, "stream": "stdout", "run": run, "offset": offset, "wait": POLL},
        )
        if not r["running"]:
            return r
        offset = r["next_offset"]


def ended(conn: Connection, name: str, run: str) -> tuple[str, int]:
    """Wait for ``run``; a line saying how it ended and where the session is now,
    and the exit code for sessionctl."""
    r = wait_for_run(conn, name, run)
    status = r.get("status") or "finished"
    code = r.get("exit_code")
    d: SessionDetail = conn.call("show", {"name": name})
    now = d["state"] + (f" ({d['reason']})" if d.get("reason") else "")
    said = f"run {run} {status}" + (f" exit={code}" if code is not None else "")
    return f"{name}: {said}; now {now}", 0 if status == "ok" else 1
