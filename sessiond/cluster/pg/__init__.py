"""The cluster's coordination in PostgreSQL: requests carried between nodes
(``requests.py``) and messages across them (``mail.py``). The sessions' store
(events, snapshots, artifacts, the lease that fences every append) is
sessiond.log.store.pg."""
