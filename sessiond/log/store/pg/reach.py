"""When the cluster's database does not answer: psycopg's connection errors as
:class:`~sessiond.errors.DatabaseUnavailable`, one error with its own exit code
(6) and a message that names the database and what to do, instead of an
"internal error" (a stopped or restarting PostgreSQL is no bug of sessiond).
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg.conninfo import conninfo_to_dict

from sessiond.errors import DatabaseUnavailable, SessiondError

# SQLSTATE classes that mean "the server went away or will not take us now":
# 08 connection exception, 57P operator intervention (57P01 admin shutdown, 57P02
# crash shutdown, 57P03 cannot connect now, 57P04 database dropped). Not the rest
# of OperationalError (a cancelled query, a lock not available): those answered.
GONE = ("08", "57P")


def where(dsn: str) -> str:
    """The database a DSN names, for people: its name and host, never a password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the database of [cluster] dsn"
    name = parts.get("dbname") or parts.get("user") or "?"
    host = parts.get("host") or "the default socket"
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"database {name!r} at {host}{port}"


def is_gone(exc: BaseException) -> bool:
    """True for an error that says the database is not reachable now."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    # No SQLSTATE: the client's own (no socket, refused, closed, a pool that
    # could not get a connection in time).
    return state is None or state.startswith(GONE)


def unavailable(dsn: str, node: str, exc: BaseException) -> DatabaseUnavailable:
    why = " ".join(str(exc).split()) or type(exc).__name__  # libpq's reasons span lines
    return DatabaseUnavailable(
        f"the cluster's database is not reachable from node {node!r} ({where(dsn)}): "
        f"{why}; nothing was done. Start PostgreSQL again (or fix [cluster] dsn) and "
        "ask again; a node that could not renew its lease meanwhile ends (exit 75) "
        "and its supervisor (systemd, make cluster) starts it again when the database is back"
    )


def recogniser(dsn: str, node: str) -> Callable[[BaseException], SessiondError | None]:
    """For :func:`sessiond.errors.recognise`: this node's database errors."""

    def known(exc: BaseException) -> SessiondError | None:
        return unavailable(dsn, node, exc) if is_gone(exc) else None

    return known
