"""The cluster's tables, and the one way they are made or upgraded.

``sessiond db migrate --dsn …`` applies the steps below that the database does
not have yet, in one transaction under an advisory lock, so two operators (or
two nodes' start scripts) running it at once do it once. A node never migrates
by itself at start: it checks the version and refuses to run on a schema it does
not know, naming the command to run.

A step, once published, never changes: a new version is a new step.
"""

from __future__ import annotations

from typing import Any

import psycopg

# pg_advisory_xact_lock key: "sessiond" as 8 bytes, so no other application's
# lock on the same database collides with it by accident.
MIGRATE_LOCK = int.from_bytes(b"sessiond", "big") & 0x7FFF_FFFF_FFFF_FFFF

STEPS: list[str] = [
    # 1: nodes, the process table, events, wakes, messages, snapshots, artifacts
    """
    CREATE TABLE nodes (
        name          text PRIMARY KEY,
        incarnation   bigint NOT NULL,
        started_at    timestamptz NOT NULL DEFAULT now(),
        renewed_at    timestamptz NOT NULL DEFAULT now(),
        lease_until   timestamptz NOT NULL,
        state         text NOT NULL DEFAULT 'up',
        labels        jsonb NOT NULL DEFAULT '{}'
    );
    CREATE TABLE sessions (
        name          text PRIMARY KEY,
        owner         text REFERENCES nodes (name),
        epoch         bigint NOT NULL DEFAULT 0,
        last_seq      bigint NOT NULL DEFAULT 0,
        last_id       text,
        spec          text,
        created_at    timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX sessions_owner ON sessions (owner);
    CREATE TABLE events (
        session       text NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
        seq           bigint NOT NULL,
        id            text NOT NULL,
        line          bytea NOT NULL,
        PRIMARY KEY (session, seq)
    );
    CREATE TABLE wakes (
        id            bigserial PRIMARY KEY,
        session       text NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
        kind          text NOT NULL,
        detail        jsonb NOT NULL DEFAULT '{}',
        dedup         text UNIQUE,
        created_at    timestamptz NOT NULL DEFAULT now(),
        taken_at      timestamptz
    );
    CREATE INDEX wakes_open ON wakes (session) WHERE taken_at IS NULL;
    CREATE TABLE messages (
        id            bigserial PRIMARY KEY,
        session       text NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
        sender        text NOT NULL,
        body          text NOT NULL,
        created_at    timestamptz NOT NULL DEFAULT now(),
        taken_at      timestamptz
    );
    CREATE INDEX messages_open ON messages (session) WHERE taken_at IS NULL;
    CREATE TABLE snapshots (
        session       text NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
        seq           bigint NOT NULL,
        reducer       integer NOT NULL,
        log_offset    bigint NOT NULL,
        last_id       text,
        state         bytea NOT NULL,
        PRIMARY KEY (session, seq)
    );
    CREATE TABLE artifacts (
        digest        text PRIMARY KEY,
        data          bytea NOT NULL
    );
    CREATE TABLE session_artifacts (
        session       text NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
        digest        text NOT NULL REFERENCES artifacts (digest),
        PRIMARY KEY (session, digest)
    );
    """,
    # 2: placement (docs/design.md section 10): the node a spec pins the session to, the
    # labels it needs of its node, and the node its workspace lives on (NULL: it
    # has none, or it lies under [cluster] shared_paths, so it may fail over)
    """
    ALTER TABLE sessions
        ADD COLUMN pinned         text,
        ADD COLUMN needs          jsonb NOT NULL DEFAULT '{}',
        ADD COLUMN workspace      text,
        ADD COLUMN workspace_node text;
    """,
    # 3: when each session stored (or last reused) each artifact: gc's
    # "unreferenced" and "fresh" rules, as a file's mtime on the files backend
    """
    ALTER TABLE session_artifacts ADD COLUMN stored_at timestamptz NOT NULL DEFAULT now();
    """,
    # 4: a request carried to the node that owns its session (or to a named
    # node, for its part of `ps`); taken once (taken_at), answered in `reply`
    """
    CREATE TABLE requests (
        id            bigserial PRIMARY KEY,
        session       text,
        node          text,
        method        text NOT NULL,
        params        jsonb NOT NULL,
        who           jsonb,
        asker         text NOT NULL,
        created_at    timestamptz NOT NULL DEFAULT now(),
        taken_by      text,
        taken_inc     bigint,
        taken_at      timestamptz,
        abandoned     boolean NOT NULL DEFAULT false,
        reply         jsonb,
        done_at       timestamptz
    );
    CREATE INDEX requests_open ON requests (id) WHERE taken_at IS NULL AND NOT abandoned;
    """,
    # 5: the append's cost (bench/README.md, "The cluster backend"). events loses
    # its foreign key to sessions: checking it was half of what inserting an
    # event cost the server, and the fence already guarantees it, since events
    # are inserted only from the RETURNING of their session's row's update (or
    # in the transaction that creates the row). What the key also did, deleting
    # a session's events with its row, a trigger does now; fsck reports an
    # event whose session row is missing. sessions gets room on its pages
    # (fillfactor; its pages are filled so from now on) so that the fence's
    # update of last_seq and last_id, columns no index covers, stays a HOT update
    # on the row's own page instead of a new row version in every index.
    """
    ALTER TABLE events DROP CONSTRAINT IF EXISTS events_session_fkey;
    CREATE FUNCTION sessiond_delete_events() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM events WHERE session = OLD.name;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER sessions_delete_events AFTER DELETE ON sessions
        FOR EACH ROW EXECUTE FUNCTION sessiond_delete_events();
    ALTER TABLE sessions SET (fillfactor = 50);
    """,
    # 6: a terminated session says so in its row (set in the transaction that
    # commits its lifecycle.changed to terminated: pg/once.py), so a send from
    # another node is refused there, as on its own node, instead of being left
    # for an owner that drops it. Sessions that terminated before are found in
    # their events once, here: by their last lifecycle change, not any (a fork of
    # a terminated session holds its parent's end, then its own start).
    """
    ALTER TABLE sessions ADD COLUMN ended boolean NOT NULL DEFAULT false;
    UPDATE sessions AS s SET ended = true WHERE (
        SELECT position('"to":"terminated"'::bytea IN e.line) > 0
        FROM events AS e WHERE e.session = s.name
          AND position('"type":"lifecycle.changed"'::bytea IN e.line) > 0
        ORDER BY e.seq DESC LIMIT 1);
    -- The append's second look at its node's lease, after any lock wait
    -- (committer.py, LIVE). VOLATILE: under READ COMMITTED its query takes a
    -- snapshot of its own, so a renewal committed while the append waited is seen
    -- (a subquery of the append would see the lease as the append began).
    CREATE FUNCTION sessiond_lease_live(p_node text, p_inc bigint, p_after bigint)
    RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM nodes WHERE name = p_node AND incarnation = p_inc
                       AND lease_until > clock_timestamp()) THEN
            RAISE EXCEPTION 'the lease of node % lapsed while its append waited', p_node
                USING ERRCODE = 'SD001';
        END IF;
        RETURN true;
    END
    $$;
    """,
    # 7: each node's load, as it says it every placement interval (cluster/balance.py):
    # its programs running, its sessions waiting `ready` for a slot, and its slots
    # (max_running), so that placement and `sessionctl nodes` compare the nodes
    """
    ALTER TABLE nodes
        ADD COLUMN running     integer NOT NULL DEFAULT 0,
        ADD COLUMN ready       integer NOT NULL DEFAULT 0,
        ADD COLUMN max_running integer NOT NULL DEFAULT 0;
    """,
]

VERSION = len(STEPS)


class SchemaMismatch(Exception):
    """The database's schema is not the one this sessiond runs on."""


def _current(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS sessiond_schema (version integer NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now())"
    )
    row = conn.execute("SELECT max(version) FROM sessiond_schema").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def migrate(dsn: str) -> tuple[int, int]:
    """Bring the schema at ``dsn`` to :data:`VERSION`; (version before, version after).

    Raises :class:`SchemaMismatch` when the database is newer than this sessiond.
    """
    with psycopg.connect(dsn, prepare_threshold=None) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        before = _current(conn)
        if before > VERSION:
            raise SchemaMismatch(
                f"the database has schema version {before}, newer than this sessiond's "
                f"{VERSION}; upgrade sessiond"
            )
        for version in range(before + 1, VERSION + 1):
            conn.execute(STEPS[version - 1].encode())
            conn.execute("INSERT INTO sessiond_schema (version) VALUES (%s)", (version,))
    return before, VERSION


def check(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """Refuse a database whose schema is missing or another version (no implicit migrate)."""
    row = conn.execute("SELECT to_regclass('sessiond_schema') IS NOT NULL").fetchone()
    version = 0
    if row and row[0]:
        got = conn.execute("SELECT max(version) FROM sessiond_schema").fetchone()
        version = int(got[0]) if got and got[0] is not None else 0
    if version != VERSION:
        raise SchemaMismatch(
            f"the database has schema version {version}, this sessiond needs {VERSION}; "
            "run `sessiond db migrate --dsn …` first (once, for the whole cluster)"
        )
