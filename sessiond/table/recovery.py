"""Why a session is blocked, and exactly the answers that would change it.

One table, used by the gate (its verdict's options), ``show``, ``gate``, the
console's recovery buttons and ``resolve`` itself (which refuses an option that
would change nothing). Each *cause* is one reason the session cannot go on; each
lists the ``resolve`` options that act on it, the other answers that do
(``approve``/``deny``), and what to do when no answer fits (restore a backup,
``apply`` a new policy).

What each resolve option does (sessiond.syscalls.approvals):

- ``--rerun``: a cut-off call or a failed step is run again; a failed run is
  started again.
- ``--accept``: the workspace as it is now is recorded (its hashes), a cut-off
  call's or failed step's work stands as done, a divergence continues on the new
  path.
- ``--discard``: open calls (asked, approved, cut off) are dropped as abandoned
  and the open turn ends.

So, per cause: a call waiting for approval is changed by approve, deny or
``--discard`` (rerun and accept leave it waiting); an expired approval, or a
call the policy now denies, only by ``--discard``; a changed workspace only by
``--accept``; damaged artifacts or a damaged log by no option at all.
"""

from __future__ import annotations

from dataclasses import dataclass

# The reasons the daemon writes when it blocks a session outside the gate: the gate
# reads them back (the lifecycle state and its reason are in the replayed state),
# so the gate's verdict and the reason shown never contradict each other.
RUN_FAILED = "run failed"
POLICY_DENIES = "policy denies the command"

RESOLVE_OPTIONS = ("rerun", "discard", "accept")


@dataclass(frozen=True)
class Cause:
    """One reason a session cannot go on."""

    kind: str  # see KINDS
    detail: str
    options: tuple[str, ...] = ()  # resolve options that change it
    answers: tuple[str, ...] = ()  # other commands that change it (approve, deny)
    todo: str = ""  # what to do besides (or when nothing here changes it)


# kind -> (resolve options, other answers, what to do besides)
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "approval": (("discard",), ("approve", "deny"), ""),
    "divergence": (("accept", "discard"), (), ""),
    "cut-off": (("rerun", "discard", "accept"), (), ""),
    "failed-step": (("rerun", "discard", "accept"), (), ""),
    "expired": (("discard",), (), "the program may ask again in a later turn"),
    "denied-now": (
        ("discard",),
        (),
        "or 'sessionctl apply' a spec whose policy allows it",
    ),
    "workspace": (("accept",), (), "or put the files back as they were"),
    "artifacts": ((), (), "restore them from a backup ('sessiond fsck' lists them)"),
    "log": ((), (), "run 'sessiond fsck' and restore the log from a backup"),
    "budget": ((), (), "'sessionctl apply' a larger budget, or wait for it to renew"),
    "run-failed": (("rerun", "discard"), (), "fix what made it fail first"),
    # its wake is still pending: --discard would only start the same denied command
    "policy-denied": (
        (),
        (),
        "'sessionctl apply' a spec whose policy allows the command, then 'resolve --rerun'; "
        "or 'sessionctl cancel' it",
    ),
    # blocked for a reason none of the above names any more (the end of a run the
    # log could not take; a gate's failure since put right): a way out stays
    "blocked": (("rerun", "discard"), (), ""),
    "arriving": (("accept", "discard"), (), ""),
    "held": ((), (), "free space for the log; the daemon records the block by itself"),
}


def cause(
    kind: str, detail: str, *, extra: tuple[str, ...] = (), drop: tuple[str, ...] = ()
) -> Cause:
    """A cause of ``kind`` (its options from KINDS, plus ``extra``, less ``drop``)."""
    options, answers, todo = KINDS[kind]
    merged = tuple(o for o in (*options, *extra) if o not in drop)
    return Cause(kind, detail, tuple(dict.fromkeys(merged)), answers, todo)


def options_of(causes: tuple[Cause, ...] | list[Cause]) -> tuple[str, ...]:
    """The resolve options that change at least one cause, in the usual order."""
    offered = {o for c in causes for o in c.options}
    order = ("accept", "discard") if causes and causes[0].kind == "divergence" else RESOLVE_OPTIONS
    return tuple(o for o in order if o in offered)


def answers_of(causes: tuple[Cause, ...] | list[Cause]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for c in causes for a in c.answers))


def refusal(name: str, option: str, causes: tuple[Cause, ...] | list[Cause]) -> str | None:
    """Why ``resolve --option`` would change nothing (None: it would change something)."""
    if option in options_of(causes):
        return None
    why = "; ".join(c.detail for c in causes) or "nothing holds it"
    return (
        f"resolve --{option} would change nothing: session {name!r} is blocked: {why}; "
        + what_to_do(name, causes)
    )


def what_to_do(name: str, causes: tuple[Cause, ...] | list[Cause]) -> str:
    """The answers that would change something, as commands to type."""
    doing = [f"'sessionctl {a} {name}'" for a in answers_of(causes)]
    doing += [f"'sessionctl resolve {name} --{o}'" for o in options_of(causes)]
    todos = [c.todo for c in causes if c.todo]
    if not doing:
        return "no answer changes it: " + "; ".join(todos) if todos else "nothing to answer"
    text = "what would: " + ", ".join(doing)
    return text + ("; " + "; ".join(todos) if todos else "")
