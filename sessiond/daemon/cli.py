"""The ``sessiond`` command.

* ``sessiond [--config FILE] [--state-dir DIR] [--socket PATH]`` runs the daemon in
  the foreground (systemd and ``make run`` run it so).
* ``sessiond fsck --state-dir DIR [--repair] [--json]`` checks a state dir offline;
  ``sessiond fsck --dsn DSN`` a cluster's database (pgfsck.py), nodes running or not.
* ``sessiond db migrate --dsn DSN`` creates or upgrades a cluster's schema (clusterdb.py).
"""

from __future__ import annotations

import sys

from sessiond import __version__

# fsck's checker and the cluster's database are imported by their commands: the
# daemon's own start imports what serving needs (service.py), and no more; and
# the plain daemon's argv is read without argparse or pathlib (see _plain), which
# the early server's start would otherwise wait for
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from pathlib import Path

    from sessiond.log.fsck import Report

# the flags of the plain daemon's command line, as _parser names them
_DAEMON_FLAGS = {"--config": "config", "--state-dir": "state_dir", "--socket": "socket"}


def _plain(argv: Sequence[str]) -> dict[str, str] | None:
    """``sessiond [--config FILE] [--state-dir DIR] [--socket PATH]``, each flag
    at most once, spelt out, its value apart and not one argparse could read as
    an option: the values, by dest. Anything else (None) goes through argparse,
    which reads these the same (tests/test_early_config.py checks both agree)."""
    if len(argv) % 2:
        return None
    found: dict[str, str] = {}
    for i in range(0, len(argv), 2):
        dest, value = _DAEMON_FLAGS.get(argv[i]), argv[i + 1]
        if dest is None or dest in found or not value or value[0] == "-":
            return None
        found[dest] = value
    return found


def _parser() -> argparse.ArgumentParser:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="sessiond",
        description="Schedules AI-agent sessions the way an operating system schedules processes.",
    )
    parser.add_argument("--version", action="version", version=f"sessiond {__version__}")
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="daemon configuration (else SESSIOND_CONFIG)"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the sessions live (else SESSIOND_STATE_DIR)",
    )
    parser.add_argument(
        "--socket", type=Path, metavar="PATH", help="the socket to listen on (else SESSIOND_SOCKET)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    fsck = sub.add_parser(
        "fsck",
        help="check the session logs, artifacts and snapshots of a state dir (offline) "
        "or of a cluster's database",
        description="Check every session under DIR/sessions (or in the cluster's database): "
        "line checksums, seq order, event schemas, artifact hashes, snapshot consistency, "
        "permissions (files), epochs along the seqs (database). Exit 0 when all is well, "
        "1 when problems were found (or remain after --repair).",
    )
    where = fsck.add_mutually_exclusive_group(required=True)
    where.add_argument("--state-dir", type=Path, metavar="DIR", dest="fsck_dir")
    where.add_argument("--dsn", dest="fsck_dsn", help="postgresql://… of a cluster's database")
    fsck.add_argument(
        "--repair",
        action="store_true",
        help="cut torn tails, drop snapshots that disagree with their log, tighten permissions; "
        "never touches corruption in the middle of a log",
    )
    fsck.add_argument("--json", action="store_true", help="one JSON object on stdout")
    db = sub.add_parser(
        "db",
        help="the cluster's PostgreSQL database (docs/design.md section 10)",
        description="Manage the database a cluster of sessiond nodes shares.",
    )
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    migrate = db_sub.add_parser(
        "migrate",
        help="create or upgrade the schema (once for the whole cluster, under an advisory lock)",
    )
    migrate.add_argument(
        "--dsn",
        required=True,
        help="postgresql://… of the cluster's database (as in [cluster] dsn)",
    )
    migrate.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import gc

    # Up to the early server's first answer made, this thread only imports
    # modules and reads the index: containers kept for the daemon's life and no
    # cyclic garbage, which the cyclic collector would only walk, again and again
    # (2-4 ms of the imports alone). What is alive then is frozen out of its way
    # (as sessiond.ipc.early.open_server does for the read) and it is turned back on.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _main(argv, collecting)
    finally:
        if collecting:
            gc.enable()  # (for a caller in this process: the daemon has exited here)


def _main(argv: Sequence[str] | None, collecting: bool) -> int:
    import gc

    flags = _plain(sys.argv[1:] if argv is None else argv)
    if flags is None:
        args = _parser().parse_args(argv)
        if collecting and args.command in ("fsck", "db"):
            gc.enable()  # commands of their own, not the daemon's start
        if args.command == "fsck":
            return _fsck(args)
        if args.command == "db":
            from sessiond.cluster.clusterdb import migrate

            return migrate(args.dsn, as_json=args.json)
        config, state_dir, sock = args.config, args.state_dir, args.socket
    else:
        from pathlib import Path

        config, state_dir, sock = (
            Path(flags[k]) if k in flags else None for k in ("config", "state_dir", "socket")
        )
    # ping and ps answered from the table index at once, on a thread, while this
    # one imports the daemon and loads the table (sessiond.daemon.early)
    import os

    from sessiond.daemon.early import open_early

    sys.setswitchinterval(0.001)  # the daemon's (service.SWITCH_INTERVAL), kept after it
    early = open_early(config, os.environ, state_dir, sock)
    if collecting:
        gc.freeze()
        gc.enable()
    from sessiond.daemon.service import run

    return run(config, state_dir, sock, early=early)


def _fsck(args: argparse.Namespace) -> int:
    from sessiond.log.fsck import check

    if args.fsck_dsn is not None:
        from sessiond.cluster.clusterdb import fsck_db

        report = fsck_db(args.fsck_dsn, repair=args.repair)
        if report is None:
            return 2
        return _report(report, args.json)
    state_dir: Path = args.fsck_dir
    if not state_dir.is_dir():
        print(
            f"sessiond fsck: {state_dir} is not a folder; pass the daemon's state dir",
            file=sys.stderr,
        )
        return 2
    return _report(check(state_dir, repair=args.repair), args.json)


def _report(report: Report, as_json: bool) -> int:
    if as_json:
        import orjson

        sys.stdout.buffer.write(orjson.dumps(report.to_dict(), option=orjson.OPT_APPEND_NEWLINE))
    else:
        for problem in report.problems:
            print(problem.line())
        left = sum(not p.repaired for p in report.problems)
        print(
            f"fsck: {report.sessions} sessions, {report.events} events, {report.artifacts} "
            f"artifacts checked; {left} problem(s)"
            + (f", {len(report.problems) - left} repaired" if len(report.problems) > left else "")
            + (f"; {report.collected} removed by gc (recorded)" if report.collected else ""),
            file=sys.stderr,
        )
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
