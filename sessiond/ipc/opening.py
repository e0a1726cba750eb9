"""What a request waits for while the daemon is still opening its sessions.

A daemon started from its table index (sessiond.table.index) serves at once and
opens its sessions in the background. Meanwhile, a request waits only for what
it needs: ``ping`` for nothing; ``ps`` for the sessions with work in flight (the
rest are listed from the index, checked against their logs); a request naming
sessions for those (each opened at once if the background load has not reached
it yet); anything else (``create``, ``reload``, ``gc``, a ``merge`` into a parent
it does not name, …) for the start-up (``daemon.ready``: every session's state
proven, every wake armed), then for the sessions it names. After that, sessions
may still be pending: what reaches one it does not name opens it first
(``Table.ensure``: a create's or a fork's name, a merge's parent, a program's
send), and what reads every session waits for all of them (``Table.ensure_all``:
gc, the console's rows and approvals, ``models``, ``log --follow`` of every
session, a sandbox's view of the other workspaces).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessiond.table.sessions import Table

# The params that name a session (a name that is none is opened as none: nothing).
NAMING = ("name", "new", "child", "into", "to", "session")
# Methods that may reach a session they do not name: they wait for the start-up.
WHOLE = frozenset({"merge", "create", "import", "reload", "gc", "web.rows", "web.login"})


# params: the request's, unparsed (any method's; only its naming keys are read)
async def opened_for(table: Table, method: str, params: Mapping[str, Any]) -> bool:
    """Return once ``method`` with ``params`` may be served (at once when the
    table is loaded). ``params`` is the request's, not parsed yet (open: any
    method's; only its naming keys are read, and a non-string is none).
    True if it may have waited (the caller asks its peer again), False if it
    returned at once."""
    if not table.loading or method == "ping":
        return False
    if method == "ps":
        await table.recovered.wait()
        return True
    names = [v for key in NAMING if isinstance(v := params.get(key), str)]
    if not names or method in WHOLE:
        await table.ready.wait()
    else:
        await table.recovered.wait()
    for name in names:
        await table.ensure(name)
    return True
