"""The lifecycle of a session (docs/design.md section 2): one table, one event per transition.

::

    create ─▶ created ─activate─▶ ready ─scheduler─▶ running ─exit 0 / sleep─▶ sleeping
      (has triggers) ───────────────────────────────────────────────────────▶ sleeping
    sleeping ─wake: replay + gate ok─▶ ready          gate not ok ─▶ blocked
    running ─interrupt─▶ sleeping                     any but terminated ─suspend─▶ suspended
    suspended ─resume─▶ sleeping (or ready if wakes are pending)
    blocked ─approve / resolve─▶ ready                any ─cancel/merge/migrate─▶ terminated
    (migrate --to, on the target) arriving ─the source commits / resolve --accept─▶
        what it was at the source (created, sleeping, suspended or blocked)

``arriving`` is a migrated session on its target until the source commits the
hand-over: nothing but the hand-over's finish moves it (``ONLY_BY``), and a
dropped copy (the source aborted; ``resolve --discard``) leaves the table
without a transition: its folder goes to ``discarded/`` (syscalls.handover).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from sessiond.errors import Refused
from sessiond.log.event_data import LifecycleChanged

STATES = (
    "created",
    "ready",
    "running",
    "sleeping",
    "suspended",
    "blocked",
    "arriving",
    "terminated",
)

TRANSITIONS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "created": frozenset({"ready", "sleeping", "suspended", "blocked", "terminated"}),
        "ready": frozenset({"running", "sleeping", "suspended", "blocked", "terminated"}),
        "running": frozenset({"sleeping", "suspended", "blocked", "terminated", "ready"}),
        # sleeping -> sleeping: the reason changes (a rate-limit cool-down starts or ends)
        "sleeping": frozenset({"sleeping", "ready", "blocked", "suspended", "terminated"}),
        "suspended": frozenset({"sleeping", "ready", "terminated"}),
        "blocked": frozenset({"ready", "sleeping", "suspended", "terminated"}),
        # the finish of a hand-over: what the session was at the source (a `ready` or
        # `running` one arrives not running, as an import does: created or sleeping)
        "arriving": frozenset({"created", "sleeping", "suspended", "blocked"}),
        "terminated": frozenset(),
    }
)

# States that only one cause may leave: an arriving copy becomes live only when its
# hand-over finishes (the source's commit, or an operator's resolve --accept).
ONLY_BY: Mapping[str, str] = MappingProxyType({"arriving": "arrive"})

OUTCOMES = ("completed", "failed", "cancelled", "merged", "migrated")


class IllegalTransition(Refused):
    """A lifecycle change the table does not allow; nothing was changed."""

    code = "illegal_transition"


def check(session: str, current: str, to: str, why: str) -> None:
    """Raise IllegalTransition unless ``current`` may become ``to``."""
    allowed = TRANSITIONS[current]
    only = ONLY_BY.get(current)
    if only is not None and why != only:
        raise IllegalTransition(
            f"cannot {why} session {session!r}: it is arriving (a hand-over from another "
            "daemon not finished yet), and nothing changes it before the source commits; "
            "if the source is gone for good, settle it with 'sessionctl resolve "
            f"{session} --accept' (make it live here) or '--discard' (drop this copy)"
        )
    if to in allowed:
        return
    if current == "terminated":
        raise IllegalTransition(
            f"cannot {why} session {session!r}: it is terminated, and a terminated session "
            "does not change again (fork it to continue its work)"
        )
    options = ", ".join(sorted(allowed))
    raise IllegalTransition(
        f"cannot {why} session {session!r}: it is {current}, and from {current} a session "
        f"can only become {options}"
    )


def change(
    session: str,
    current: str,
    to: str,
    *,
    why: str,
    reason: str = "",
    outcome: str | None = None,
    until: str | None = None,
) -> LifecycleChanged:
    """The event for an allowed transition (checked against the table)."""
    check(session, current, to, why)
    if (to == "terminated") != (outcome is not None):
        raise ValueError("an outcome goes with `terminated` and only with it")
    return LifecycleChanged.model_validate(
        {"from": current, "to": to, "reason": reason, "outcome": outcome, "until": until}
    )
