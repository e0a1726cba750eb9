"""Which requests a cluster node carries to the node that owns their session
(docs/design.md section 10: any node's socket serves the whole cluster).

The dispatch asks its router (a :class:`~sessiond.syscalls.seams.Router`, given
at its construction on a cluster node, None otherwise) before it serves a
request, after the peer checks: a process of a run is refused on the control
socket here, on the node it connected to, and never reaches another node; on
the program endpoint a program gets only what its spec grants (never an
operator action), checked here too. The forwarding itself (the database, the
waiting) is the cluster floor's (sessiond.cluster.forward); this floor only
names what is carried and how a reply turns back into the error it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessiond.errors import SessiondError

# Each carried method and the param that names its session. The others are
# answered here: ping, nodes, models, create, drain, reload, gc, web.login, notify, the
# daemon-to-daemon hand-over, send (messages go through the messages table),
# export and import (bundles, streamed), and every sdk.* call (a run talks to
# its own node).
ROUTED: dict[str, str] = {
    "show": "name",
    "replay": "name",
    "gate": "name",
    "log": "name",
    "activate": "name",
    "suspend": "name",
    "resume": "name",
    "interrupt": "name",
    "cancel": "name",
    "fork": "name",
    "merge": "child",
    "migrate": "name",
    "compact": "name",
    "cat": "name",
    "output": "name",
    "trace.export": "name",
    "approve": "name",
    "deny": "name",
    "resolve": "name",
    "apply": "name",
    "web.approvals": "name",  # without a name: the node's own (sessiond.syscalls.console)
}


class Carried(SessiondError):
    """An error another node answered with whose code this node has no plain
    class for; :func:`error_of` makes a subclass with that code and exit code."""


# a reply's error as another daemon sent it: checked key by key here
def error_of(reply: Mapping[str, Any]) -> SessiondError:
    """The error a node's reply names, as the class with that code when there is
    a plain one (so ``except NoSuchSession`` still works here), else as Carried."""
    err = reply.get("error") or {}
    code, message = str(err.get("code", "internal")), str(err.get("message", "no message"))
    exit_code = int(err.get("exit", 70))
    found = _by_code().get(code)
    if found is None or found.exit_code != exit_code:
        found = type("Carried", (Carried,), {"code": code, "exit_code": exit_code})
    return found(message)


def _by_code() -> dict[str, type[SessiondError]]:
    """Every SessiondError class whose constructor takes just a message, by code."""
    out: dict[str, type[SessiondError]] = {}
    todo: list[type[SessiondError]] = [SessiondError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not issubclass(cls, Carried) and cls.__init__ is SessiondError.__init__:
            out.setdefault(cls.code, cls)
    return out
