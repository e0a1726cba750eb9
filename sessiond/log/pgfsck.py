"""``sessiond fsck --dsn``: check (and carefully repair) a cluster's database.

The same checks as the files fsck (fsck.py), reported the same way, where the
database can be wrong: every line's checksum; seqs 1..N without a gap, up to
the end the process table names (``sessions.last_seq``, ``last_id``); every
event against its schema; the epoch never decreasing along the seqs and never
above the session's (a stale owner's write would break either); every
referenced artifact present with its hash; every snapshot equal to a replay up
to its seq. There is no torn tail (a commit is whole or absent) and no file
mode. ``--repair`` only deletes snapshots that disagree with their log.

It reads with no node running or beside live ones: a session's row and its
events are committed together, so what it reads up to the row's end is whole.
"""

from __future__ import annotations

from sessiond.codec import decode_line
from sessiond.errors import InvalidInput
from sessiond.log.events import decode
from sessiond.log.evidence import Evidence
from sessiond.log.fsck import Problem, Report, check_artifacts, compare_snapshot
from sessiond.log.replay import apply
from sessiond.log.state import State
from sessiond.log.store.pg.pglog import READ_BATCH
from sessiond.log.store.pg.pgstore import PgStore


def label(dsn: str) -> str:
    """The database in a report, without its password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:  # a malformed DSN fails at connect, with its reason
        return "the cluster's database"
    return f"database {parts.get('dbname') or '?'} at {parts.get('host') or 'localhost'}"


def check_db(dsn: str, *, repair: bool = False) -> Report:
    """Check every session in the database at ``dsn`` (raises SchemaMismatch, or
    psycopg's error when it cannot be reached)."""
    store = PgStore(dsn, node="fsck")  # reads only: it never registers a lease
    try:
        report = Report(label(dsn))
        for name in store.names():
            report.sessions += 1
            _check_session(store, name, report, repair)
        _check_orphans(store, report)
        return report
    finally:
        store.close_sync()


def _check_orphans(store: PgStore, report: Report) -> None:
    """Events whose session has no row: no node wrote them through its fence (an
    append needs the row; a delete of the row deletes its events), so they came
    from outside sessiond, or the row was lost. Never repaired: nothing can say
    which of the two it is."""
    rows = store.select(
        "SELECT e.session, count(*), min(e.seq), max(e.seq) FROM events AS e "
        "WHERE NOT EXISTS (SELECT 1 FROM sessions AS s WHERE s.name = e.session) "
        "GROUP BY e.session ORDER BY e.session",
        {},
    )
    for session, count, first, last in rows:
        quoted = str(session).replace("'", "''")
        report.events += int(count)
        report.problems.append(
            Problem(
                session,
                "orphan-events",
                f"{count} events (seqs {first}..{last}) belong to no session in the "
                "process table; restore its row from a backup, or delete them "
                f"(DELETE FROM events WHERE session = '{quoted}')",
            )
        )


def _check_session(store: PgStore, name: str, report: Report, repair: bool) -> None:
    problems: list[Problem] = []
    row = store.select(
        "SELECT last_seq, last_id, epoch FROM sessions WHERE name = %(n)s", {"n": name}
    )
    if not row:
        return  # deleted since it was listed
    last_seq, last_id, session_epoch = int(row[0][0]), row[0][1], int(row[0][2])
    state = State(session=name)
    snapshots = store.snapshots(name)
    snap_seqs = set(snapshots.seqs())
    evidence = Evidence()
    expected, top_epoch, end_id = 1, 0, None
    replayable = True  # past a gap or a bad line, a replay's state means nothing
    while expected <= last_seq:
        rows = store.select(
            "SELECT seq, id, line FROM events WHERE session = %(s)s AND seq >= %(f)s "
            "AND seq <= %(l)s ORDER BY seq LIMIT %(n)s",
            {"s": name, "f": expected, "l": last_seq, "n": READ_BATCH},
        )
        if not rows:
            break
        for at, event_id, raw in rows:
            seq = int(at)
            if seq != expected:
                problems.append(_gap(name, expected, seq - 1))
                replayable = False
            expected, end_id = seq + 1, event_id
            report.events += 1
            record = decode_line(bytes(raw))
            if record is None or record.get("seq") != seq or record.get("id") != event_id:
                why = "fails its checksum" if record is None else "does not match its row"
                problems.append(
                    Problem(name, "corrupt-line", f"seq {seq} {why}; restore it from a backup")
                )
                replayable = False
                continue
            epoch = record.get("epoch")
            if isinstance(epoch, int):
                _check_epoch(name, seq, epoch, top_epoch, session_epoch, problems)
                top_epoch = max(top_epoch, epoch)
            try:
                decode(record)
            except InvalidInput as exc:
                problems.append(Problem(name, "invalid-event", str(exc)))
                continue
            evidence.add(record)
            if replayable:
                apply(state, record)
                if seq in snap_seqs:
                    _compare_snapshot(store, name, state, problems, repair)
    _check_end(store, name, (expected, end_id), (last_seq, last_id), snap_seqs, problems, repair)
    check_artifacts(store.artifacts(name), name, evidence, report, problems)
    report.problems.extend(problems)


def _check_end(  # noqa: PLR0917 (one caller)
    store: PgStore,
    name: str,
    read: tuple[int, str | None],
    table: tuple[int, str | None],
    snap_seqs: set[int],
    problems: list[Problem],
    repair: bool,
) -> None:
    """The log reaches the end the process table names; no snapshot lies past it."""
    (expected, end_id), (last_seq, last_id) = read, table
    if expected <= last_seq:
        problems.append(_gap(name, expected, last_seq))
    elif last_seq and end_id != last_id:
        problems.append(
            Problem(
                name,
                "corrupt-line",
                f"the process table ends at seq {last_seq} with id {last_id}, the log with "
                f"id {end_id}; restore it from a backup",
            )
        )
    for seq in sorted(snap_seqs):
        if seq > last_seq:
            problems.append(
                Problem(
                    name,
                    "snapshot-ahead",
                    f"snapshot at seq {seq} is past the log's end (seq {last_seq}); the log wins",
                    repairable=True,
                )
            )
            if repair:
                _drop_snapshot(store, name, seq)
                problems[-1].repaired = True


def _gap(name: str, first: int, last: int) -> Problem:
    which = f"seq {first}" if first == last else f"seqs {first}..{last}"
    return Problem(
        name, "seq-gap", f"{which} missing from the log; restore it from a backup (never repaired)"
    )


def _check_epoch(  # noqa: PLR0917 (one caller)
    name: str, seq: int, epoch: int, top: int, session_epoch: int, problems: list[Problem]
) -> None:
    if epoch < top:
        problems.append(
            Problem(
                name,
                "epoch-decreased",
                f"seq {seq} was written under epoch {epoch} after epoch {top}: a stale "
                "owner's write got through its fence",
            )
        )
    elif epoch > session_epoch:
        problems.append(
            Problem(
                name,
                "epoch-ahead",
                f"seq {seq} carries epoch {epoch}, above the session's {session_epoch}",
            )
        )


def _compare_snapshot(
    store: PgStore, name: str, state: State, problems: list[Problem], repair: bool
) -> None:
    snapshots = store.snapshots(name)
    snap = snapshots.load(state.seq)
    if snap is None and state.seq not in snapshots.seqs():
        return  # a live node pruned it since it was listed (it keeps the newest few)
    drop = (lambda: _drop_snapshot(store, name, state.seq)) if repair else None
    compare_snapshot(name, state, snap, problems, drop)


def _drop_snapshot(store: PgStore, name: str, seq: int) -> None:
    store.snapshots(name).drop(seq)
