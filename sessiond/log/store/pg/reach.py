"""When the cluster's database does not answer: psycopg's connection errors as
:class:`~sessiond.errors.DatabaseUnavailable`, one error with its own exit code
(6) and a message that names the database and what to do, instead of an
"internal error" (a stopped or restarting PostgreSQL is no bug of sessiond).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from sessiond.errors import DatabaseUnavailable, SessiondError

# SQLSTATE classes that mean "the server went away or will not take us now":
# 08 connection exception, 57P operator intervention (57P01 admin shutdown, 57P02
# crash shutdown, 57P03 cannot connect now, 57P04 database dropped). Not the rest
# of OperationalError (a cancelled query, a lock not available): those answered.
GONE = ("08", "57P")

# How long a caller waits for a pooled connection before it asks the database
# itself whether it answers at all (and then, again, every as long).
PROBE_EVERY = 1.0


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


# A pool waits up to its timeout (30 s) for a connection, and while the database
# is down it never gets one: a request would hang past the node's own lease, and
# the person asking would see the node vanish instead of the reason. So a caller
# that waits longer than PROBE_EVERY asks the database directly: if that fails,
# the caller gets the database's own error at once (DatabaseUnavailable above);
# if it answers, the pool is only busy and the caller waits on.


# the pool's connection kwargs: psycopg's own type for them
def _probe(pool: ConnectionPool[Any] | AsyncConnectionPool[Any]) -> tuple[str, dict[str, Any]]:
    """What a direct connection to the pool's database takes: its DSN, its options."""
    dsn, given = pool.conninfo, pool.kwargs
    assert isinstance(dsn, str)  # the stores give a DSN and a dict, never functions
    assert isinstance(given, dict)
    # psycopg.connect's **kwargs, as the pool keeps them
    kwargs: dict[str, Any] = dict(given)
    if "connect_timeout" not in conninfo_to_dict(dsn):
        kwargs.setdefault("connect_timeout", 2)
    return dsn, kwargs


class Pool(ConnectionPool[psycopg.Connection[Any]]):
    """A ConnectionPool whose waiters learn at once that the database is gone."""

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            left = deadline - time.monotonic()
            try:
                return super().getconn(max(min(left, PROBE_EVERY), 0.01))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise
                dsn, kwargs = _probe(self)
                with psycopg.connect(dsn, **kwargs):
                    pass  # it answers: the pool is busy, not the database gone


class AsyncPool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """The loop's pool, whose waiters learn at once that the database is gone."""

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            left = deadline - time.monotonic()
            try:
                return await super().getconn(max(min(left, PROBE_EVERY), 0.01))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise
                dsn, kwargs = _probe(self)
                probe = await psycopg.AsyncConnection.connect(dsn, **kwargs)
                await probe.close()  # it answers: the pool is busy, not the database gone
