"""The program endpoint's rules: what a session's program may ask, and as whom.

docs/design.md section 8, "Who may approve". Programs reach the daemon through a
socket of their own (the program endpoint, ``SESSIOND_SOCKET`` in their
environment), never the control socket. There, every request carries the run's
token (``SESSIOND_TOKEN``): the ``sdk.*`` methods in their params, as they
always did, and every other method in the frame's ``token`` (sessionctl sends
it when it runs inside a run). The token's session is the caller: the request
never says who it is.

Served: ``ping``, the ``sdk.*`` methods, and the methods the caller's spec
grants (``[run] grants``; sessiond.table.spec.GRANTABLE lists what may be
granted: never approve, deny, resolve, reload, apply, migrate, export, import).
And the identity is the caller's:

- ``send``: the sender is the calling session; a ``--from`` naming any other is
  refused, never recorded.
- ``fork`` and ``create``: decided by the caller's policy (a tool of that name;
  allowed unless listed, and ``ask`` refuses: nobody can answer here), and the
  new session may not be allowed more than the caller
  (sessiond.table.policy.widening).
- ``merge``: only into the calling session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sessiond.errors import InvalidInput, Refused
from sessiond.replies import JsonObject
from sessiond.table.policy import widening
from sessiond.table.policy_rules import decide
from sessiond.table.sessions import Session, Table
from sessiond.table.spec import GRANTABLE, SessionSpec, parse_spec


class NotGranted(Refused):
    """A program asked for what its run may not do (exit 1)."""

    code = "permission_denied"


OPERATOR = (
    "approve", "deny", "resolve", "reload", "apply", "migrate", "export", "import", "gc",
    "web.login", "handover.finish", "handover.abort", "handover.status",
)  # fmt: skip


class ProgramGuard:
    """Admits one request on the program endpoint, or refuses it saying why."""

    def __init__(self, table: Table, session_for: Any) -> None:
        self.table = table
        self.session_for = session_for  # Tokens.session_for: token -> (session, grant)

    def caller(self, token: object) -> Session:
        if not isinstance(token, str) or not token:
            raise NotGranted(
                "the program endpoint serves the programs of runs: every request carries "
                "the run's token (SESSIOND_TOKEN, which sessionctl sends by itself inside "
                "a run); a person uses the control socket"
            )
        s: Session = self.session_for(token)[0]
        return s

    def admit(self, method: str, token: object, params: JsonObject) -> JsonObject:
        """The params to serve ``method`` with for the caller, or NotGranted."""
        s = self.caller(token)
        if method not in GRANTABLE:
            why = (
                "it is an operator action: a person answers on the control socket, and no "
                "spec can grant it to a program"
                if method in OPERATOR
                else "the program endpoint does not serve it"
            )
            raise NotGranted(f"session {s.name!r}'s program may not call {method}: {why}")
        spec = s.spec
        grants = spec.run.grants if spec is not None and spec.run is not None else []
        if method not in grants:
            raise NotGranted(
                f"session {s.name!r}'s program may not call {method}: its spec does not grant "
                f"it (it grants {', '.join(grants) or 'nothing'}); add {method!r} to [run] "
                "grants in the spec (docs/spec.md) if it should"
            )
        assert spec is not None
        if method in ("fork", "create"):
            self._policy_allows(s, spec, method)
        if method == "send":
            sender = params.get("sender", "sessionctl")
            if sender not in ("sessionctl", s.name):
                raise NotGranted(
                    f"a program sends as its own session {s.name!r}; it cannot send as "
                    f"{sender!r} (drop --from, or pass --from {s.name})"
                )
            # The sender's patterns, secrets and token travel with its text: it
            # leaves masked as its own log would keep it.
            return {**params, "sender": s.name, **_masked(s, params, "text")}
        if method == "fork":
            source = self.table.get(str(params.get("name", "")))
            if source.spec is not None:
                self._no_wider(s, spec, source.spec, f"a fork of {source.name!r}")
        elif method == "create":
            text, base = params.get("spec"), params.get("base")
            if not isinstance(text, str) or not isinstance(base, str):
                raise InvalidInput("bad parameters: create needs spec and base as text")
            new = parse_spec(text, base=Path(base), source=str(params.get("source", "spec")))
            self._no_wider(s, spec, new, f"session {new.name!r}")
        elif method == "merge":
            params = {**params, **_masked(s, params, "summary")}  # as a message's text
            child = self.table.get(str(params.get("child", "")))
            into = params.get("into") or child.journal.state.parent
            if into != s.name:
                raise NotGranted(
                    f"session {s.name!r}'s program may merge only into its own session, "
                    f"not into {into!r}"
                )
        return params

    @staticmethod
    def _policy_allows(s: Session, spec: SessionSpec, method: str) -> None:
        """A program's ``fork`` and ``create`` are its own acts, under its own policy:
        decided like a tool of that name that writes in this daemon (allowed unless
        the policy lists it). A question cannot be asked here (the request would wait
        on a person): ``ask`` refuses as ``deny`` does, naming the rule."""
        verdict = decide(spec.policy, method, "workspace-write")
        if verdict.decision != "allow":
            raise NotGranted(
                f"session {s.name!r}'s policy does not allow its program to {method} "
                f"({verdict.rule}); a person can {method} on the control socket"
            )

    @staticmethod
    def _no_wider(s: Session, mine: SessionSpec, new: SessionSpec, what: str) -> None:
        problems = widening(new, mine)
        if problems:
            raise NotGranted(
                f"{what} would be allowed more than session {s.name!r} itself: "
                f"{'; '.join(problems)}. A program's create and fork cannot widen its own "
                "policy; a person can create it on the control socket"
            )


def _masked(s: Session, params: JsonObject, name: str) -> JsonObject:
    """``params[name]`` masked by the calling session's redactor, as an update."""
    value, r = params.get(name), s.redactor()
    return {name: r.text(value)} if r is not None and isinstance(value, str) else {}
