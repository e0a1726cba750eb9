"""Times and actions as the console shows them to a person.

A time is shown relative to now ("3 min ago", "in 52 min") with the exact time,
to the second and in UTC, on hover (``title=``): raw RFC 3339 with microseconds
is for machines. static/app.js keeps the same words up to date in the browser
(the ``<time>`` elements carry the instant in ``datetime=``).

The buttons a session offers follow the transition table
(sessiond.table.lifecycle) and the syscalls' own refusals: a terminated session
offers none, a suspended one offers resume and cancel.
"""

from __future__ import annotations

import datetime as dt

from markupsafe import Markup, escape

from sessiond.table.lifecycle import ONLY_BY, TRANSITIONS

LIFECYCLE = ("activate", "suspend", "resume", "interrupt", "cancel")


def actions_for(state: str, runnable: bool = True) -> list[str]:
    """The lifecycle actions that would change a session in ``state`` (in LIFECYCLE's order).

    activate makes a session ready, but refuses a running, suspended or blocked
    one (resume, approve or resolve it instead) and one with no ``[run]``
    program (``runnable`` False: nothing to start); resume takes only a suspended
    session, interrupt only a running one; a state only one cause may leave
    (an arriving copy) offers nothing."""
    allowed = TRANSITIONS.get(state, frozenset())
    if state in ONLY_BY or not allowed:
        return []
    out = []
    if runnable and "ready" in allowed and state not in ("running", "suspended", "blocked"):
        out.append("activate")
    if "suspended" in allowed:
        out.append("suspend")
    if state == "suspended":
        out.append("resume")
    if state == "running":
        out.append("interrupt")
    if "terminated" in allowed:
        out.append("cancel")
    return out


def parse(ts: str | None) -> dt.datetime | None:
    """An RFC 3339 time as the log writes it (``...Z``, microseconds), or None."""
    if not ts or not isinstance(ts, str):
        return None
    try:
        when = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def exact(when: dt.datetime) -> str:
    """To the second, in UTC, readable: ``2026-12-06 07:34:18 UTC``."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    """``40 ms``, ``2.5 s``, ``12 s``, ``3 min``, ``2 h 5 min``, ``3 d``: the unit that matters."""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 60:
        return f"{int(seconds)} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d"


def relative(when: dt.datetime, now: dt.datetime) -> str:
    """``just now``, ``3 min ago``, ``in 52 min``."""
    delta = (when - now).total_seconds()
    if abs(delta) < 5:
        return "just now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(delta)} ago"


def time_tag(ts: str | None, now: dt.datetime | None = None, empty: str = "—") -> Markup:
    """``<time>`` with the relative words, the exact time on hover (Jinja's ``when``)."""
    when = parse(ts)
    if when is None:
        return Markup(escape(ts or empty))
    now = now or dt.datetime.now(dt.UTC)
    return Markup('<time class="rel" datetime="{}" title="{}">{}</time>').format(
        when.isoformat().replace("+00:00", "Z"), exact(when), relative(when, now)
    )


def wake_tag(text: str | None, now: dt.datetime | None = None) -> Markup:
    """A next wake as ``ps`` gives it (``2026-12-06T08:00:00Z; on message``): its
    time, if it starts with one, as :func:`time_tag`, the rest as it is."""
    if not text:
        return Markup("—")
    first, sep, rest = text.partition("; ")
    if parse(first) is None:
        return Markup(escape(text))
    return time_tag(first, now) + escape(sep + rest)
