"""The cluster's coordination on PostgreSQL: membership, take-overs, hand-overs
and placement (``coordination.py``, the :class:`~sessiond.cluster.coordination.Coordination`
interface), and the channels between nodes (sessiond.cluster.channels): requests
carried between them (``requests.py``), messages across them (``mail.py``) and
the broker of wake-ups, LISTEN/NOTIFY (``channels.py``, which makes all three).
The sessions' store (events, snapshots, artifacts, the lease that fences every
append) is sessiond.log.store.pg."""
