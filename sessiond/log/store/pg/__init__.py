"""The cluster backend: every node's sessions in one PostgreSQL (docs/design.md section 10).

``schema.py`` (the tables and ``sessiond db migrate``), ``nodes.py`` (leases,
incarnations, claims: who owns a session, under which epoch), ``pglog.py`` (one
session's log, every append fenced in one statement), ``pgparts.py`` (artifacts,
snapshots), ``pgstore.py`` (the :class:`~sessiond.log.store.base.Store`),
``placement.py`` (where a session may run), ``once.py`` (a cron fire taken once).
psycopg is an optional dependency (the ``cluster`` extra): nothing imports this
package unless ``[cluster] dsn`` is set.
"""
