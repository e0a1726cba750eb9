"""Deliberately broken builds of the daemon, for the campaign's self-test.

    python -m tests.faults.broken BREAK [sessiond's arguments...]

patches the named part of the daemon in this process, then runs
``sessiond.daemon.cli.main`` as the ``sessiond`` command would. Nothing here is
reachable from the daemon's configuration: a break exists only in this wrapper.
Each break names the invariant of the campaign's table that must catch it
(tests/faults/selftest.py checks that it does).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def patch(owner: object, name: str, value: object) -> None:
    """Replace ``owner.name`` (a module's global, a class's method) for this process."""
    setattr(owner, name, value)


FSYNC = "group-commit fsync does nothing"
DIR_FSYNC = "directory fsync after create is skipped"


def _fsync_noop() -> None:
    from sessiond.daemon import faults, service

    real = faults.io_hooks

    def io_hooks(config: Any) -> Any:
        return dataclasses.replace(real(config), fsync=lambda _fd: None)

    patch(service, "io_hooks", io_hooks)


def _dir_fsync_skipped() -> None:
    from sessiond.log.store import durable, files

    patch(durable, "fsync_dir", lambda _path: None)
    patch(files, "fsync_dir", lambda _path: None)


def _gate_allows() -> None:
    from sessiond.runs import continuation, settle
    from sessiond.table import gate

    patch(gate, "rerun_refusal", lambda *_a, **_k: None)
    patch(settle, "rerun_refusal", lambda *_a, **_k: None)
    real = gate.evaluate  # what continuation imported

    def evaluate(*args: Any, **kwargs: Any) -> gate.GateVerdict:
        verdict = real(*args, **kwargs)
        if verdict.outcome == "blocked":
            return gate.GateVerdict(verdict.checks, "ok", actions=verdict.actions)
        return verdict

    patch(continuation, "evaluate", evaluate)


def _no_step_replay() -> None:
    from sessiond.runs import steps

    # a step recorded ok is no longer answered from the log: it starts again
    patch(steps, "ANSWERED", frozenset({"denied", "approval", "approved"}))


SPAWNER_DIR = "broken-spawner"
SPAWNER = '''\
"""The real spawner with its subtree kill narrowed to its own session: whatever a
program detaches with setsid outlives it (a broken build, tests/faults/broken.py)."""
import importlib.util, os, sys

spec = importlib.util.spec_from_file_location("spawner_real", {real!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
real = mod.descendants


def descendants(root):
    out = []
    for pid in real(root):
        try:
            if os.getsid(pid) == os.getsid(root):
                out.append(pid)
        except OSError:
            pass
    return out


mod.descendants = descendants
sys.exit(mod.main(sys.argv))
'''


def _no_orphan_stop() -> None:
    from sessiond.daemon import service
    from sessiond.runs import spawner_client

    # the runpeer check knows a spawner by its path's tail: keep it. Beside the state
    # dir, where whoever ran this finds (and ends) what it leaves running.
    state_dir = Path(sys.argv[sys.argv.index("--state-dir") + 1])
    folder = state_dir.parent / SPAWNER_DIR / "sessiond" / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spawner.py").write_text(SPAWNER.format(real=str(spawner_client.SPAWNER)))
    patch(spawner_client, "SPAWNER", folder / "spawner.py")
    patch(service, "kill_marked", lambda *_a, **_k: {})


class _Trusting:
    """An examiner that takes every peer on the control socket for an operator."""

    said = False

    def __init__(self, *_args: Any) -> None:
        pass

    def refusal(self) -> None:
        return None

    def close(self) -> None:
        pass


def _no_operator_check() -> None:
    from sessiond.ipc import server

    patch(server, "Examiner", _Trusting)


def _compaction_as_daemon() -> None:
    import asyncio

    import orjson

    from sessiond.syscalls import compaction

    async def as_daemon(_starter: Any, _s: Any, planned: Any) -> str:
        # the daemon's own child, as its uid, with its environment: outside the spawner
        proc = await asyncio.create_subprocess_exec(
            *planned.command,
            cwd=planned.cwd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(proc.communicate(orjson.dumps(planned.older)), 60)
        return out.decode(errors="replace").strip()[: compaction.SUMMARY_LIMIT] or "none"

    patch(compaction, "run_compact_command", as_daemon)


def _no_redaction() -> None:
    from sessiond.redaction import Redactor

    def same(_self: Redactor, value: Any) -> Any:
        return value

    patch(Redactor, "text", same)
    patch(Redactor, "data", same)
    patch(Redactor, "walk", same)
    patch(Redactor, "ident", same)


# name -> (what is broken, the invariant that must catch it ("a | b": either), the patch)
BREAKS: dict[str, tuple[str, str, Callable[[], None]]] = {
    "fsync-noop": (FSYNC, "acknowledged events lost", _fsync_noop),
    "dir-fsync-skipped": (
        DIR_FSYNC,
        # a session, a log or a snapshot whose folder entry the cut took
        "acknowledged creates lost | acknowledged events lost | logs unreadable after repair",
        _dir_fsync_skipped,
    ),
    "gate-allows": (
        "the gate always allows",
        # its verdict on a cut-off call is wrong; where the workload reaches that
        # call again first, the ledger sees it run twice
        "interrupted work handled per its contract | a step or an unsafe wake executed twice",
        _gate_allows,
    ),
    "no-step-replay": (
        "step replay is off (finished steps run again)",
        "a step or an unsafe wake executed twice",
        _no_step_replay,
    ),
    "no-orphan-stop": (
        "orphan stopping is off",
        "orphan processes after restart",
        _no_orphan_stop,
    ),
    "no-operator-check": (
        "the operator check is off (a program approves itself)",
        "answers given by a run's process",
        _no_operator_check,
    ),
    "no-redaction": ("redaction is off", "secret bytes stored", _no_redaction),
    "compaction-as-daemon": (
        "compaction started as the daemon",
        # root's uid, the control socket in reach (the socket's own check of the
        # peer's ancestry still refuses the approval: the daemon is its parent)
        "run processes outside the boundary (ledger) | answers given by a run's process",
        _compaction_as_daemon,
    ),
}


def main(argv: list[str]) -> int:
    name, rest = argv[0], argv[1:]
    BREAKS[name][2]()
    from sessiond.daemon.cli import main as sessiond

    return sessiond(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
