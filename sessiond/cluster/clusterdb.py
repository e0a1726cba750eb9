"""``sessiond db migrate``: the one way a cluster's schema is made or upgraded.

Kept apart from cli.py so that psycopg (the optional ``cluster`` extra) is
imported only by those who ask for the cluster.
"""

from __future__ import annotations

import sys

import orjson

from sessiond.log.fsck import Report


def migrate(dsn: str, *, as_json: bool = False) -> int:
    """Exit 0 when the schema is current (made or upgraded now, or already so);
    3 when the database cannot be reached; 5 when it is newer than this sessiond
    or the DSN is bad;
    2 when psycopg is not installed."""
    try:
        import psycopg

        from sessiond.log.store.pg import schema
    except ImportError:
        print(
            "sessiond db migrate: psycopg is not installed; install sessiond with the "
            "'cluster' extra (pip install 'sessiond[cluster]')",
            file=sys.stderr,
        )
        return 2
    try:
        before, after = schema.migrate(dsn)
    except psycopg.OperationalError as exc:
        print(f"sessiond db migrate: cannot reach the database: {exc}".strip(), file=sys.stderr)
        return 3
    except schema.SchemaMismatch as exc:
        print(f"sessiond db migrate: {exc}", file=sys.stderr)
        return 5
    except psycopg.Error as exc:
        print(f"sessiond db migrate: {exc}; check --dsn".strip(), file=sys.stderr)
        return 5
    if as_json:
        sys.stdout.buffer.write(
            orjson.dumps({"from": before, "to": after}, option=orjson.OPT_APPEND_NEWLINE)
        )
    elif before == after:
        print(f"schema is current (version {after}); nothing to do")
    else:
        print(f"schema migrated from version {before} to {after}")
    return 0


def fsck_db(dsn: str, *, repair: bool = False) -> Report | None:
    """``sessiond fsck --dsn``: the database's report, or None (said on stderr) when
    psycopg is missing, the database cannot be reached or its schema is not ours."""
    try:
        import psycopg

        from sessiond.log.pgfsck import check_db
        from sessiond.log.store.pg.schema import SchemaMismatch
    except ImportError:
        print(
            "sessiond fsck: psycopg is not installed; install sessiond with the "
            "'cluster' extra (pip install 'sessiond[cluster]')",
            file=sys.stderr,
        )
        return None
    try:
        return check_db(dsn, repair=repair)
    except (psycopg.Error, SchemaMismatch) as exc:
        why = " ".join(str(exc).split())  # one line: libpq's reasons span several
        print(f"sessiond fsck: cannot check the database: {why}; check --dsn", file=sys.stderr)
        return None
    except Exception as exc:  # psycopg_pool's timeout when nothing answers
        if type(exc).__module__.startswith("psycopg"):
            print(f"sessiond fsck: cannot reach the database: {exc}", file=sys.stderr)
            return None
        raise
