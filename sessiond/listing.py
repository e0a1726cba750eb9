"""What a ``ps`` request asks for: filters, the order, which terminated rows hide.

On the ground floor because both ends need the same rules: sessionctl checks
``--state``, ``--label`` and ``--sort`` before it sends them (a bad one is a
usage error, with no round trip, and a did-you-mean), and the daemon filters and
sorts with these very functions, on one daemon and across a cluster's nodes
(cluster/forward.py), so that thousands of rows are never sent only to be dropped.

Terminated sessions stay in the table (and in ``ps --all``), but a listing
leaves out those terminated more than ``HIDE_TERMINATED_AFTER`` ago, as
``systemctl list-units`` leaves out inactive units, and says how many it left out.
A ``--state`` that names ``terminated`` shows them all: it asked for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# sessionctl ps imports this module: typing, dataclasses (with inspect) and datetime
# cost it more than the rest of its run, so the types are mypy's alone and Listing
# is a plain class.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypedDict, TypeVar

    # A row as the daemon makes it (replies.PsRow, or a console row, with more keys)
    # or as another cluster node's answer decoded it: what is filtered comes back as
    # it was.
    R = TypeVar("R", bound=Mapping[str, Any])

# The states of a session (table/lifecycle.py), then the ones a cluster's ps gives a
# session no live node answered for (cluster/forward.py, cluster/placement.py).
STATES = ("created", "ready", "running", "sleeping", "suspended", "blocked", "arriving",
          "terminated", "waiting", "unowned", "unknown")  # fmt: skip
# --sort state: what needs a person first, what is over last
STATE_ORDER = ("blocked", "running", "ready", "arriving", "waiting", "unknown", "unowned",
               "sleeping", "suspended", "created", "terminated")  # fmt: skip
SORTS = ("agent", "name", "state", "last-active", "priority")
DEFAULT_SORT = "agent"  # ps groups sessions by their owning agent (docs/spec.md)
HIDE_TERMINATED_AFTER = 3600.0  # seconds: terminated longer ago than this hides


if TYPE_CHECKING:

    class ListingParams(TypedDict):
        """A listing in a request's params (``ps``, and what a cluster node asks the
        others)."""

        state: list[str]
        agent: list[str]
        label: list[str]
        all: bool
        sort: str

    class PsRequest(ListingParams):
        """A ``ps`` request's params; ``footer``: answer a PsPage (replies.py), not rows."""

        footer: bool

else:  # at run time a TypedDict is the dict it types
    ListingParams = PsRequest = dict


class Listing:
    """One ``ps`` request's filters and order (every filter must hold); a value:
    equal to another with the same fields, never changed once made."""

    __slots__ = ("agents", "all", "labels", "sort", "states")
    states: frozenset[str]
    agents: frozenset[str]
    labels: tuple[tuple[str, str], ...]
    all: bool
    sort: str

    def __init__(
        self,
        states: frozenset[str] = frozenset(),
        agents: frozenset[str] = frozenset(),
        labels: tuple[tuple[str, str], ...] = (),
        all: bool = False,
        sort: str = DEFAULT_SORT,
    ) -> None:
        for name, value in zip(self.__slots__, (agents, all, labels, sort, states), strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Listing is not changed once made (set {name})")

    def _fields(self) -> tuple[object, ...]:
        return (self.states, self.agents, self.labels, self.all, self.sort)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Listing) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Listing(states={self.states!r}, agents={self.agents!r}, "
            f"labels={self.labels!r}, all={self.all!r}, sort={self.sort!r})"
        )

    @classmethod
    def of(
        cls,
        states: Iterable[str] = (),
        agents: Iterable[str] = (),
        labels: Iterable[str] = (),
        all: bool = False,
        sort: str = DEFAULT_SORT,
    ) -> Listing:
        """The listing asked for, or ValueError naming what is wrong and the choices.
        A state may come as a comma list ("blocked,ready"), as on systemctl."""
        wanted = {part.strip() for s in states for part in s.split(",") if part.strip()}
        for state in sorted(wanted):
            if state not in STATES:
                raise ValueError(
                    f"state {state!r} is not a session state; one of: {', '.join(STATES)}"
                    + suggest(state, STATES)
                )
        pairs = []
        for label in labels:
            key, eq, value = label.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"label {label!r} is not KEY=VALUE (e.g. team=docs)")
            pairs.append((key.strip(), value.strip()))
        if sort not in SORTS:
            raise ValueError(
                f"sort {sort!r} is not one of: {', '.join(SORTS)}" + suggest(sort, SORTS)
            )
        agent_set = {part.strip() for a in agents for part in a.split(",") if part.strip()}
        return cls(frozenset(wanted), frozenset(agent_set), tuple(pairs), all, sort)

    # a ps row, or one as another node's answer decoded it (R above)
    def matches(self, row: Mapping[str, Any]) -> bool:
        if self.states and row.get("state") not in self.states:
            return False
        if self.agents and (row.get("agent") or "") not in self.agents:
            return False
        if not self.labels:  # (the usual ps: no generator for each of 10,000 rows)
            return True
        labels = row.get("labels") or {}
        return all(labels.get(k) == v for k, v in self.labels)

    # a ps row, or one as another node's answer decoded it (R above)
    def hides(self, row: Mapping[str, Any], now: float) -> bool:
        """A row left out unless ``--all``: terminated more than an hour ago."""
        if self.all or "terminated" in self.states or row.get("state") != "terminated":
            return False
        then = _seconds(row.get("last_active"))
        return then is not None and now - then > HIDE_TERMINATED_AFTER

    def apply(self, rows: Iterable[R], now: float) -> tuple[list[R], int]:
        """(the rows to show, in order; how many terminated ones hid)."""
        kept: list[R] = []
        hidden = 0
        for row in rows:
            if not self.matches(row):
                continue
            if self.hides(row, now):
                hidden += 1
            else:
                kept.append(row)
        return self.order(kept), hidden

    def order(self, rows: list[R]) -> list[R]:
        rows = sorted(rows, key=lambda r: str(r["name"]))  # the tie-break of every order
        if self.sort == "agent":
            rows.sort(key=lambda r: r.get("agent") or "")
        elif self.sort == "state":
            rank = {s: n for n, s in enumerate(STATE_ORDER)}
            rows.sort(key=lambda r: rank.get(r.get("state") or "", len(rank)))
        elif self.sort == "last-active":  # the latest first; never active last
            rows.sort(key=lambda r: r.get("last_active") or "", reverse=True)
        elif self.sort == "priority":  # the highest first, as the run queue takes them
            rows.sort(key=lambda r: -int(r.get("priority") or 0))
        return rows

    def params(self) -> ListingParams:
        """The wire's form (what a cluster node passes to the others)."""
        return {
            "state": sorted(self.states),
            "agent": sorted(self.agents),
            "label": [f"{k}={v}" for k, v in self.labels],
            "all": self.all,
            "sort": self.sort,
        }


def suggest(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the closest choices, or "" (difflib, as git does)."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


def _seconds(ts: str | None) -> float | None:
    if not ts:
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
