"""The cluster floor (docs/design.md section 10; docs/architecture.md).

A daemon as a node of a cluster: its lease (``lease.py``), where a session may
run (``placement.py``), messages across nodes (``mailbox.py``), requests carried
to the node that runs their session (``forward.py``, ``follows.py``), and the
interfaces they share (``coordination.py``: what the nodes agree on;
``channels.py``: how they reach each other), implemented on PostgreSQL
(``pg/``). It stands above the
syscalls: the kernel, the dispatch and the console receive what it changes as
seams (sessiond.syscalls.seams) when they are constructed, and ``daemon/`` only
wires them (``node.py`` makes them). psycopg is imported only when ``[cluster]
dsn`` is set: ``lease.py`` and ``placement.py`` load without it.
"""
