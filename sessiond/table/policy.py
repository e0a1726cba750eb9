"""Tool policy: which intents run, which need a person, which never run.

A session's ``[policy]`` lists tool names (globs) under ``deny``, ``ask`` and
``allow``; the first list that matches decides, in that order, so a deny always
wins. A tool no list names is decided by its side effect: ``none``, ``read``
and ``workspace-write`` are allowed, ``external-write`` asks. The decision
names the rule that matched, and is recorded as ``policy.decided``.
"""

from __future__ import annotations

import os

from sessiond.table.spec import RunSpec, SessionSpec


def widening(new: SessionSpec, caller: SessionSpec) -> list[str]:
    """How a session a program creates or forks would be allowed more than the
    program's own session (empty: it is not). docs/design.md section 8: a program's
    ``create`` and ``fork`` cannot widen its policy.

    Checked on the lists as written, so it errs on the side of refusing: the new
    policy must deny every pattern the caller's denies, ask (or deny) every
    pattern it asks, allow only patterns it allows, and keep approvals no longer.
    Together these mean no tool and no side effect is decided more leniently
    (a deny beats an ask beats an allow; what no list names falls to the same
    side-effect default on both). Its program may be granted no method the
    caller's is not (``[run] grants``), and a command run is a program too: a
    session with a ``[run]`` needs a caller that has one.

    A ``[compact] exec`` command is a program as well: it is named by the spec,
    its file may be in a workspace a program writes, and it runs when anyone
    compacts the session. It runs confined like the session's program (as
    ``[run] user``, in a holder and cgroup of its own, with no grants and no
    token), so it can do no more than a program of the caller's own; but a caller
    with no program of its own cannot bring one in through it.

    Nor may its run reach more of the host: its workspace and ``writable`` lie in
    what the caller's run may write, its ``readable`` in what it may read, it
    hides all the caller's run hides, has no network if the caller has none, no
    secret the caller's run is not given, and the caller's profile. Its ``[model]
    allow`` names only patterns the caller's names (the models it may call).
    """
    mine, theirs = caller.policy, new.policy
    problems = []
    if missing := [p for p in mine.deny if p not in theirs.deny]:
        problems.append(f"it does not deny {', '.join(missing)}")
    if missing := [p for p in mine.ask if p not in theirs.ask and p not in theirs.deny]:
        problems.append(f"it does not ask for {', '.join(missing)}")
    if extra := [p for p in theirs.allow if p not in mine.allow]:
        problems.append(f"it allows {', '.join(extra)}, which this session's policy does not")
    if theirs.approval_ttl > mine.approval_ttl:
        problems.append(
            f"its approvals last {theirs.approval_ttl:g}s, longer than {mine.approval_ttl:g}s"
        )
    if extra := [m for m in new.model.allow if m not in caller.model.allow]:
        problems.append(f"it may use models {', '.join(extra)} ([model] allow), this one not")
    problems += _standing(new, caller)
    granted = set(caller.run.grants) if caller.run is not None else set()
    if new.compact is not None and caller.run is None:
        problems.append("it has a [compact] exec command, a program too, and this session has none")
    if new.run is not None:
        if caller.run is None:
            problems.append("it has a program, and this session has none")
        else:
            if extra := sorted(set(new.run.grants) - granted):
                problems.append(f"its program is granted {', '.join(extra)}, which this one is not")
            problems += _reach(new.run, caller.run)
    return problems


def _standing(new: SessionSpec, caller: SessionSpec) -> list[str]:
    """Nor may it stand higher at the model and the run queue, or spend more: its
    priority is no higher, its agent is the caller's (an agent's daily budget and
    its fair share of the model count all its sessions: another name would escape
    both), and each budget the caller has it has too, no larger."""
    problems = []
    if new.priority > caller.priority:
        problems.append(f"its priority {new.priority} is above this session's {caller.priority}")
    if new.agent != caller.agent:
        problems.append(
            f"it runs as agent {new.agent or '(none)'!r}, this session as "
            f"{caller.agent or '(none)'!r}"
        )
    mine, theirs = caller.budget.model_dump(), new.budget.model_dump()
    for key, limit in mine.items():
        if limit and not 0 < theirs[key] <= limit:
            problems.append(
                f"its [budget] {key} is {theirs[key] or 'unlimited'}, this session's {limit:g}"
            )
    return problems


def _inside(path: str, folders: list[str]) -> bool:
    # Resolved: a symlink the caller's run made in its workspace leads anywhere
    real = os.path.realpath(path)
    return any(real == f or real.startswith(f.rstrip("/") + "/") for f in folders)


def _roots(run: RunSpec) -> list[str]:
    """Where a run may write in its workspace: all of it, or (``writes``) each
    pattern up to its first glob character, as declared."""
    if not run.writes:
        return [run.cwd]
    roots = []
    for pattern in run.writes:
        plain = pattern.split("*")[0].split("?")[0].split("[")[0]
        root = os.path.normpath(os.path.join(run.cwd, plain))
        if plain != pattern and not plain.endswith("/"):
            root = os.path.dirname(root)  # a glob in the last part: its folder
        roots.append(root)
    return roots


def _reach(new: RunSpec, mine: RunSpec) -> list[str]:
    """What of the host the new session's run would reach (the daemon opens its
    workspace and ``writable`` to its uid, and shows it its ``readable``) that the
    caller's own run does not."""
    own = [os.path.realpath(p) for p in (*_roots(mine), *mine.writable)]
    seen = [os.path.realpath(mine.cwd), *own, *(os.path.realpath(p) for p in mine.readable)]
    problems = []
    if extra := [p for p in _roots(new) if not _inside(p, own)]:
        problems.append(
            f"it may write {', '.join(extra)} (its workspace, or its writes), outside what "
            f"this session's run may write ({', '.join(own)})"
        )
    if extra := [p for p in new.writable if not _inside(p, own)]:
        problems.append(
            f"it is writable {', '.join(extra)}, which this session's run may not write"
        )
    if extra := [p for p in new.readable if not _inside(p, seen)]:
        problems.append(f"it is readable {', '.join(extra)}, which this session's run may not read")
    if missing := [p for p in mine.hide if p not in new.hide]:
        problems.append(f"it does not hide {', '.join(missing)}")
    if extra := sorted(n for n, ref in new.secrets.items() if ref not in mine.secrets.values()):
        # a secret is read by the daemon (a file it may read, its own environment)
        problems.append(f"its program is given secrets {', '.join(extra)}, which this one is not")
    if new.profile != mine.profile:
        # a profile brings its own environment (credentials, a model) and budget
        problems.append(f"it runs with profile {new.profile!r}, this session with {mine.profile!r}")
    if mine.network == "none" and new.network != "none":
        problems.append(f'its network is "{new.network}", and this session\'s is "none"')
    return problems
