"""What happens once for the whole cluster (docs/design.md section 10, "Wakes").

The store commits a batch with its keys in one transaction (its fence, the
keys, the events: log/store/pg/once.py); which records carry keys is said here,
by the floor that knows what they mean, and handed to the store when it is
made (``lease.make_store``):

- a cron ``wake.requested`` (its schedule and fire time): a fire is in one
  session's log once, whatever the clocks of the nodes that fire it say;
- a ``message.received`` carried from another node (its ``message_id`` names
  the ``messages`` row, cluster/mailbox.py): the row is taken exactly when the
  message is in the log;
- a ``lifecycle.changed`` to or from ``terminated``: the row's ``ended``, which
  a send from another node is refused by (cluster/pg/mail.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from sessiond.log.store.base import Record
from sessiond.log.store.pg.once import Keys


def cron_fires(session: str, records: list[Record]) -> list[tuple[str, str, str]]:
    """(dedup key, fire, schedule) of each cron wake among ``records``."""
    out = []
    for r in records:
        data = r.get("data") or {}
        if r.get("type") != "wake.requested" or data.get("trigger") != "cron":
            continue
        details = data.get("details") or {}
        fire, schedule = str(details.get("fire", "")), str(details.get("schedule", ""))
        out.append((f"cron|{session}|{schedule}|{fire}", fire, schedule))
    return out


CARRIED = "cluster:"  # a carried message's message_id: this prefix, then its row's id


def ends(records: Iterable[Record]) -> bool | None:
    """What ``records`` make of the row's ``ended``: True when their last lifecycle
    change terminates the session, False when it leaves ``terminated`` (a fork of a
    terminated session starts: log/lineage.py copies its parent's end first), None
    when they change nothing of it."""
    out: bool | None = None
    for r in records:
        if r.get("type") != "lifecycle.changed":
            continue
        data = r.get("data") or {}
        if data.get("to") == "terminated":
            out = True
        elif data.get("from") == "terminated":
            out = False
    return out


def carried_messages(records: list[Record]) -> list[int]:
    """The ``messages`` rows whose delivery ``records`` hold."""
    out = []
    for r in records:
        if r.get("type") != "message.received":
            continue
        mid = (r.get("data") or {}).get("message_id")
        if isinstance(mid, str) and mid.startswith(CARRIED) and mid[len(CARRIED) :].isdigit():
            out.append(int(mid[len(CARRIED) :]))
    return out


def keys_of(session: str, records: list[Record]) -> Keys:
    """The store's ``keys_of`` on a cluster node: what a batch of ``session``'s
    records commits once, with its events (log/store/pg/once.py)."""
    return Keys(cron_fires(session, records), carried_messages(records), ends(records))
