"""Where a test may stop the daemon: the ``Faults`` the runs floor and the
syscalls are built with.

The crash and race tests kill a real daemon, or hold it, at named points of a
start, a settle and a hand-over (``before-intent`` … ``arrive-after-finish``).
The code at those points calls ``faults.point(name)`` (or ``hold``); in
production the object is ``NoFaults``, which does nothing, so no test hook reads
configuration or waits on a production path. The implementation the tests use,
driven by the daemon configuration's ``fault`` keys, is
``sessiond.daemon.faults.ConfigFaults``: it is wired in at start-up, above this
floor, and only when one of those keys is set.
"""

from __future__ import annotations

from typing import Protocol


class Faults(Protocol):
    """The named points a test may stop the daemon at."""

    def armed(self, point: str) -> bool:
        """Whether a test stops at ``point``: the code around it then takes its
        steps one at a time (durable apart), so that the stop falls between them."""
        ...

    def point(self, point: str) -> None:
        """Die here, as a crash would, if a test asked for ``point``."""
        ...

    async def hold(self, point: str, session: str) -> None:
        """As ``point``; then, if a test asked to hold ``point``, return only once
        it lets go (it acts meanwhile, e.g. stops the start under way)."""
        ...


class NoFaults:
    """Production: no point stops anything."""

    # the arguments are the protocol's: nothing here needs them (ARG002)

    def armed(self, point: str) -> bool:  # noqa: ARG002
        return False

    def point(self, point: str) -> None:  # noqa: ARG002
        return None

    async def hold(self, point: str, session: str) -> None:  # noqa: ARG002
        return None


NO_FAULTS: Faults = NoFaults()
