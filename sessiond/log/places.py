"""A step's place in its turn, and whether a step asked there is the recorded one.

A turn's steps come in call order. An unkeyed step's place is its ordinal; a
keyed step (one a thread takes, ``key=``) takes no ordinal of its own: its place
is among the keyed steps taken after unkeyed step ``n - 1`` and before unkeyed
step ``n``, where the SDK gives it ordinal ``n``; within that group keys tell the
steps apart, in whatever order the threads ask. A step taken inside another
step's ``fn`` (a nested step) has its place inside its parent's: ordinals count
again from 1 within the parent.

As data, a place is a list of ``(position, segment)`` from the outermost step in:
position ``2n`` for unkeyed step ``n`` and ``2n - 1`` for the keyed group before
it; the segment is the step's own part of its slot (``"3"``, ``"k:fetch-a"``).
Slots, the step table's keys, join the segments with ``>`` (a character a key
may not hold), so the slots of steps at the top level are what they always were.

A step's **identity** at its place is its kind, name, args digest and key. A
later run of the turn that asks, at a recorded place, for a step that differs in
any of them diverges (:func:`judge`), before the work runs. Plain data and pure
functions: the fold (log/turns.py), the gate and the daemon's ``sdk.step`` share
them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessiond.log.records import StepRecord

Place = tuple[tuple[int, str], ...]

# Statuses of a step that never started and was closed as such: nothing ran, so
# a later run may take another step there.
GONE = frozenset({"dropped"})


def segment(ordinal: int | None, key: str | None) -> str:
    return f"k:{key}" if key else str(ordinal)


def slot_of(ordinal: int | None, key: str | None, parent: str | None = None) -> str:
    """The step table's key for a step: its own key where it names one, else its
    ordinal; inside its parent's slot where it is a nested step."""
    own = segment(ordinal, key)
    return f"{parent}>{own}" if parent else own


def position(ordinal: int, key: str | None) -> int:
    return 2 * ordinal - (1 if key else 0)


def place_of(step: StepRecord) -> Place:
    """A recorded step's place (its parent's, recorded with it, when nested)."""
    stored = step.get("place")
    if stored is not None:
        return tuple((int(p), str(s)) for p, s in stored)
    return ((position(step["ordinal"], step["key"]), segment(step["ordinal"], step["key"])),)


def asked_place(
    steps: dict[str, StepRecord], ordinal: int, key: str | None, parent: str | None
) -> Place:
    """The place of a step asked at ``ordinal``/``key`` inside ``parent`` (a slot)."""
    own = ((position(ordinal, key), segment(ordinal, key)),)
    if parent is None:
        return own
    above = steps.get(parent)
    return (place_of(above) if above is not None else ()) + own


def after(a: Place, b: Place) -> bool:
    """Whether place ``a`` comes after place ``b`` in the turn: later at the first
    level where they differ, or inside ``b``. Keyed steps of one group are neither
    before nor after each other."""
    for (pa, sa), (pb, sb) in zip(a, b, strict=False):
        if (pa, sa) == (pb, sb):
            continue
        return pa > pb
    return len(a) > len(b)


@dataclass(frozen=True)
class Asked:
    """A step as a run asks for it."""

    kind: str
    name: str
    digest: str | None
    ordinal: int
    key: str | None
    parent: str | None  # the parent's slot, for a nested step
    strict: bool = False  # a model step whose request digest is part of its identity
    # the key is an id the turn recorded (an agent's tool call id): steps the same but
    # for such keys are distinct, and the key cannot change unless the record does
    key_is_id: bool = False

    @property
    def slot(self) -> str:
        return slot_of(self.ordinal, self.key, self.parent)


@dataclass(frozen=True)
class Judgement:
    """``same`` (the recorded step: answer from it), ``new`` (nothing is recorded
    at this place: take it), ``diverged`` (``recorded`` is the recorded step the
    asked one differs from) or ``refused`` (``why``: the program is at fault)."""

    verdict: str
    recorded: StepRecord | None = None
    why: str = ""


def identical(recorded: StepRecord, asked: Asked) -> bool:
    if (recorded["kind"], recorded["name"], recorded["key"]) != (
        asked.kind,
        asked.name,
        asked.key,
    ):
        return False
    if asked.kind == "tool" or asked.strict:
        return bool(recorded["digest"] == asked.digest)
    return True  # a model step's request may change (timestamps); strict=True says not


def judge(steps: dict[str, StepRecord], asked: Asked, run: str) -> Judgement:
    """Whether ``asked`` is the step the turn recorded at its place (``run``: the id
    of the run asking; the calls it made start with ``run + "."``)."""
    recorded = steps.get(asked.slot)
    if recorded is not None and recorded["status"] not in GONE:
        # Whatever its status (finished, failed, cut off, marked for a rerun by a
        # person): only the very same step may take its place.
        if identical(recorded, asked):
            return Judgement("same", recorded)
        return Judgement("diverged", recorded)
    if asked.key_is_id:
        # its key comes from the record (a replayed model response): it cannot change
        # unless the record does, and such keys tell twin steps apart
        return Judgement("new")
    mine = f"{run}."
    # The same step at the same place under another key (or with a key where it had
    # none, or none where it had one): its key changed.
    if asked.kind == "tool":
        twins = [st for st in steps.values() if _twin(st, asked)]
        for st in twins:
            if not str(st["call"]).startswith(mine):
                return Judgement("diverged", st)
        for st in twins:
            if st["key"] is not None and asked.key is not None:
                return Judgement(
                    "refused",
                    st,
                    f"step {asked.name!r} under key {asked.key!r} has the same args as the "
                    f"step under key {st['key']!r} at the same place in the turn: steps told "
                    "apart only by their keys could not be told from a key that changed; put "
                    "what tells them apart in args (or pass key_is_id=True where the key is an "
                    "id the turn recorded)",
                )
    if asked.key is not None:
        # A keyed step new to a group the recorded turn went past: the group's
        # steps were all taken there (the threads that take keyed steps are joined
        # before the next unkeyed step), so another step stood where this one asks.
        # (what earlier runs recorded: this run's own steps may come in any order,
        # as an asyncio program's requests race each other; earlier runs' are the record)
        earlier = [
            st
            for st in steps.values()
            if st["status"] not in GONE
            and st.get("slot") != "command"
            and not str(st["call"]).startswith(mine)
        ]
        here = asked_place(steps, asked.ordinal, asked.key, asked.parent)
        later = [(place_of(st), st) for st in earlier]
        later = [(p, st) for p, st in later if after(p, here)]
        if later:
            return Judgement("diverged", min(later, key=lambda item: item[0])[1])
    return Judgement("new")


def _twin(st: StepRecord, asked: Asked) -> bool:
    """Whether ``st`` is ``asked`` but for its key, at the same place: the same tool
    and args, in the same group (a keyed step's) or at its ordinal (an unkeyed's)."""
    return (
        # the ordinal first: it turns nearly every step of a long turn away at once
        # (judge asks this of every step of the turn, for each new step)
        st["ordinal"] == asked.ordinal
        and st["status"] not in GONE
        and st.get("slot") != "command"
        and st["kind"] == "tool"
        and (st["name"], st["digest"], st["ordinal"]) == (asked.name, asked.digest, asked.ordinal)
        and st.get("parent") == asked.parent
        and not (st["key"] is None and asked.key is None)
    )
