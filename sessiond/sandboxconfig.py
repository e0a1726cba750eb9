"""The ``[run]`` keys of the boundary, shared by the daemon's configuration and a
session spec (sessiond/runs/sandbox.py applies them).

``sandbox``: ``"on"`` (default) confines every run with bubblewrap; ``"off"``
only in the daemon's configuration (a spec cannot lift the boundary the
operator set). ``network``: ``"host"`` (default) or ``"none"`` (no interface
but ``lo``, where the model gateway answers for a run whose spec allows models).
``writable`` / ``readable`` / ``hide``: absolute paths a run may write, may read
although the boundary hides them, or may not see at all.

In the daemon's configuration only: ``bwrap`` (the program, a name on PATH or
an absolute path), ``setpriv`` (what drops to a run's uid inside the sandbox)
and ``dynamic_uids``, the range a root daemon gives runs their uids from.

Imported by the ground floor (config) and the ipc floor (``run_uids``): no
import beyond the ground floor.
"""

from __future__ import annotations

import os
from collections.abc import Container
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, field_validator

# 0x70000-0x7FFFF: above every uid a distribution hands out to people and
# services, below systemd's container range (0x80000 and up, nspawn's
# 524288-1878982655), and away from systemd's own DynamicUser range
# (61184-65519), so a run's uid never collides with one systemd gives out.
DEFAULT_DYNAMIC_UIDS = "458752-524287"
SYSTEMD_DYNAMIC = range(61184, 65520)


def _paths(values: list[str], key: str) -> list[str]:
    for value in values:
        if not os.path.isabs(value) or "\0" in value:
            raise ValueError(
                f"{key}: {value!r} is not an absolute path; name each path from / "
                '(e.g. "/var/cache/myapp")'
            )
    return [os.path.normpath(v) for v in values]


class SandboxKeys(BaseModel):
    """The boundary's keys of a ``[run]`` table (a spec's and the daemon's)."""

    sandbox: Literal["on", "off"] = "on"
    network: str = "host"
    writable: list[str] = []
    readable: list[str] = []
    hide: list[str] = []

    @field_validator("network")
    @classmethod
    def _network(cls, value: str) -> str:
        if value == "gateway":
            raise ValueError(
                'network = "gateway" is not a value: with network = "none" a run reaches the '
                "model gateway, and nothing else, where its spec allows models ([model] allow); "
                'use "host" (the default) or "none"'
            )
        if value not in ("host", "none"):
            raise ValueError(f'{value!r}: network is "host" (the default) or "none"')
        return value

    @field_validator("writable")
    @classmethod
    def _writable(cls, values: list[str]) -> list[str]:
        return _paths(values, "writable")

    @field_validator("readable")
    @classmethod
    def _readable(cls, values: list[str]) -> list[str]:
        return _paths(values, "readable")

    @field_validator("hide")
    @classmethod
    def _hide(cls, values: list[str]) -> list[str]:
        return _paths(values, "hide")


def parse_uid_range(text: str) -> range:
    """``"A-B"`` -> range(A, B + 1); ValueError naming what is wrong."""
    lo_text, sep, hi_text = text.partition("-")
    try:
        lo, hi = int(lo_text), int(hi_text)
    except ValueError:
        lo, hi = -1, -1
    if not sep or lo < 1 or hi < lo or hi >= 2**31 - 1:
        raise ValueError(
            f"{text!r}: write dynamic_uids as FIRST-LAST, two uids above 0 "
            f'(the default is "{DEFAULT_DYNAMIC_UIDS}")'
        )
    found = range(lo, hi + 1)
    if found.start < SYSTEMD_DYNAMIC.stop and SYSTEMD_DYNAMIC.start < found.stop:
        raise ValueError(
            f"{text!r} overlaps systemd's DynamicUser range "
            f"{SYSTEMD_DYNAMIC.start}-{SYSTEMD_DYNAMIC.stop - 1}: choose another range "
            f'(the default is "{DEFAULT_DYNAMIC_UIDS}")'
        )
    return found


class DaemonSandboxKeys(SandboxKeys):
    """What only the daemon's ``[run]`` table says of the boundary."""

    bwrap: str = "bwrap"
    setpriv: str = "setpriv"
    dynamic_uids: str = DEFAULT_DYNAMIC_UIDS

    @field_validator("dynamic_uids")
    @classmethod
    def _uids(cls, value: str) -> str:
        parse_uid_range(value)
        return value

    def uid_range(self) -> range:
        return parse_uid_range(self.dynamic_uids)


@dataclass(frozen=True)
class RunUids(Container[int]):
    """The uids a run may have: the dynamic range (a root daemon with the sandbox
    on) and ``[run] user``'s. No process with one of them is an operator."""

    dynamic: range
    accounts: frozenset[int]

    def __contains__(self, uid: object) -> bool:
        return uid in self.dynamic or uid in self.accounts


class RunKeys(Protocol):
    """The daemon's ``[run]`` as read here (sessiond.config.RunConfig, which
    imports this module: named by what is read, not imported)."""

    @property
    def sandbox(self) -> str: ...

    @property
    def user(self) -> str | None: ...

    def identity(self) -> tuple[int, int] | None: ...

    def uid_range(self) -> range: ...


class WithRun(Protocol):
    """A daemon configuration (sessiond.config.DaemonConfig), for its ``[run]``."""

    @property
    def run(self) -> RunKeys: ...


def run_uids(config: WithRun) -> RunUids:
    """Every uid a run of this daemon may have (for telling a run from an operator)."""
    ident = config.run.identity()
    accounts = frozenset({ident[0]} if ident is not None else ())
    # The range counts whether or not runs get dynamic uids now: a process with
    # such a uid is a run's of this or an earlier configuration, never an operator.
    return RunUids(config.run.uid_range(), accounts)


def dynamic_uids_on(config: WithRun) -> bool:
    """Runs get a dynamic uid: the daemon is root, the sandbox is on (the drop happens
    inside it) and no ``[run] user`` is configured."""
    run = config.run
    return os.geteuid() == 0 and run.sandbox == "on" and run.user is None
