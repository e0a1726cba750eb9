"""The cluster's coordination on PostgreSQL: membership, take-overs, hand-overs
and placement (``coordination.py``, the :class:`~sessiond.cluster.coordination.Coordination`
interface), requests carried between nodes (``requests.py``) and messages across
them (``mail.py``). The sessions' store (events, snapshots, artifacts, the lease
that fences every append) is sessiond.log.store.pg."""
