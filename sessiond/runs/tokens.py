"""Run tokens: what lets an ``sdk`` program speak for its own run, and only that.

A run token is issued for one run of one session (``SESSIOND_TOKEN``). It can
append events to that session only, only while the run lasts; anything else is
refused. Tokens live in the daemon's memory only: never in events, logs,
artifacts or bundles.

They are apart from the SDK calls (runs.sdk_calls) because the run's own path
uses them too: starting an sdk run issues one, settling it revokes it and reads
how the program said its run ends.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from sessiond.errors import Refused
from sessiond.table.sessions import Session, Table


class TokenRefused(Refused):
    """A run token that is unknown, belongs to another session, or to a run that ended."""

    code = "token_refused"


@dataclass
class RunGrant:
    session: str
    run: str
    calls: int = 0  # tool calls started (the budget's tool_calls_per_run)
    calls_model: int = 0
    # the places its model calls through the gateway took: the n of step keys gw.<n>
    gateway_places: set[int] = field(default_factory=set)
    # its SDK model steps under way -> where in gateway_called each began: it wraps
    # the gateway steps called from there on (its fn called the model through the
    # gateway: runs.steps records the spend once)
    model_frames: dict[str, int] = field(default_factory=dict)
    # the gateway steps (gw.<n>) called while an SDK model step was under way, in
    # order: one list for all of them (runs.wrapping says why)
    gateway_called: list[str] = field(default_factory=list)
    # the gateway's responses to this run, by the provider's response id -> gw.<n>: an
    # SDK model step whose result is one of them wrapped it (made before its step)
    gateway_ids: dict[str, str] = field(default_factory=dict)
    before: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    frames: set[str] = field(default_factory=set)  # calls that took nested steps
    exit_intent: str | None = None  # sleep | complete
    summary: str = ""


class Tokens:
    """The run tokens given out and not yet revoked, each with its grant."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.grants: dict[str, RunGrant] = {}

    def issue(self, s: Session, run_id: str) -> str:
        """A new token for this run of ``s`` (the program's ``SESSIOND_TOKEN``)."""
        token = secrets.token_urlsafe(32)
        self.grants[token] = RunGrant(s.name, run_id)
        return token

    def end_run(self, s: Session, run_id: str) -> None:
        for token, grant in list(self.grants.items()):
            if grant.session == s.name and grant.run == run_id:
                del self.grants[token]

    def grant_of(self, s: Session) -> RunGrant | None:
        run = s.run
        if run is None:
            return None
        return next(
            (g for g in self.grants.values() if g.session == s.name and g.run == run.run_id),
            None,
        )

    def check(self, token: str, session: str | None) -> None:
        """Refuse a token offered for a session other than its own."""
        grant = self.grants.get(token)
        if grant is not None and session is not None and grant.session != session:
            raise TokenRefused(
                f"this run token belongs to session {grant.session!r}, not {session!r}"
            )
        self.session_for(token)

    def session_for(self, token: str) -> tuple[Session, RunGrant]:
        grant = self.grants.get(token)
        if grant is None:
            raise TokenRefused(
                "this run token is not valid: it belongs to a run that has ended, or to no run; "
                "a token works only for the run it was issued to"
            )
        s = self.table.get(grant.session)
        if s.run is None or s.run.run_id != grant.run:
            raise TokenRefused(f"the run {grant.run} of session {grant.session!r} has ended")
        return s, grant
