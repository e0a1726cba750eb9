"""Approvals, policy and the gate in process (moved from tests/e2e/test_approvers.py;
the hostile programs that try to approve their own calls over the real sockets, as
the daemon's uid and as another, stay there)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sessiond.wire import RemoteError
from tests.inproc.fakes import FakeRun
from tests.inproc.harness import Harness
from tests.inproc.test_steps import SPEC, Agent

VICTIM = """name = "victim"
[run]
exec = ["true", "victim"]
cwd = "."
[policy]
ask = ["command"]
"""


async def test_apply_gives_a_live_session_a_new_policy_recorded_with_who_applied_it(
    h: Harness,
) -> None:
    await h.create(VICTIM, "victim")
    await h.call("activate", name="victim")
    await h.event("victim", "approval.requested")
    stricter = VICTIM.replace("ask =", "deny =")
    source = str(h.root / "stricter.toml")
    await h.call(
        "apply", name="victim", spec=stricter, base=str(h.root), source=source,
        by="no commands today",
    )  # fmt: skip
    (applied,) = await h.log("victim", types=["spec.applied"])
    data = applied["data"]
    assert data["changed"] == ["policy"]
    assert (data["uid"], data["channel"], data["by"]) == (os.getuid(), "cli", "no commands today")
    # The approval given now is for a command the policy in force denies: the gate
    # refuses it, and the command never runs.
    await h.call("approve", name="victim")
    blocked = await h.event(
        "victim",
        "lifecycle.changed",
        lambda r: r["data"]["to"] == "blocked" and "denied" in r["data"]["reason"],
    )
    assert "denied by the policy in force now" in blocked["data"]["reason"]
    await h.idle()
    assert not await h.log("victim", types=["run.started"])
    assert h.spawner.started == []
    (granted,) = await h.log("victim", types=["approval.granted"])
    assert (granted["data"]["call"], granted["data"]["uid"]) == ("r1.command", os.getuid())
    # a spec of another session is refused, naming both
    other = VICTIM.replace("victim", "other")
    refused = await h.refused("apply", name="victim", spec=other, base=str(h.root))
    assert refused.exit_code == 5
    assert "'other', not 'victim'" in str(refused)


async def test_a_fork_does_not_inherit_an_approval_its_parent_has_not_used(h: Harness) -> None:
    """Before: the child kept the parent's granted approval and ran the command
    unasked, so one approval ran it twice (once in each)."""
    ran: list[str] = []

    @h.program("victim")
    async def victim(run: FakeRun) -> int:
        ran.append(run.session)
        return 0

    await h.create(VICTIM, "victim")
    await h.call("activate", name="victim")
    await h.event("victim", "approval.requested")
    await h.call("suspend", name="victim")  # approved, and not used yet
    await h.call("approve", name="victim")
    await h.call("fork", name="victim", new="twin")
    await h.call("activate", name="twin")
    forked_at = (await h.call("show", name="twin"))["fork_seq"]
    await h.event("twin", "approval.requested", after=forked_at)
    shown = await h.call("show", name="twin")
    assert shown["state"] == "blocked"
    assert [a["tool"] for a in shown["pending_approvals"]] == ["command"]
    assert not await h.log("twin", types=["run.started"])
    assert ran == []
    # the parent's approval is still the parent's: it runs once
    await h.call("resume", name="victim")
    await h.event("victim", "run.finished")
    await h.idle()
    assert ran == ["victim"]


async def test_a_programs_fork_is_decided_by_its_own_policy(h: Harness) -> None:
    """A program's fork and create are its own acts under its own policy: a policy
    that denies (or asks for) `fork` refuses it on the program endpoint, even where
    the spec grants the method."""
    refusals: dict[str, RemoteError] = {}

    @h.program("forker")
    async def forker(run: FakeRun) -> int:
        try:
            await run.ctl("fork", name=run.session, new=f"{run.session}-twin")
        except RemoteError as exc:
            refusals[run.session] = exc
            return exc.exit_code
        return 0

    for name, policy in (("denied", 'deny = ["fork"]'), ("asked", 'ask = ["fork"]')):
        (h.root / name).mkdir()
        spec = (
            f'name = "{name}"\n[run]\nexec = ["true", "forker"]\ncwd = "{Path(h.root, name)}"\n'
            f'grants = ["fork"]\n[policy]\n{policy}\n'
        )
        await h.create(spec, name)
        await h.call("activate", name=name)
        await h.event(name, "run.finished")
        await h.idle()
        assert refusals[name].exit_code == 1
        assert "policy does not allow its program to fork" in str(refusals[name])
        missing = await h.refused("show", name=f"{name}-twin")
        assert missing.exit_code == 4  # no such session


async def test_an_expired_approval_blocks_at_the_gate(h: Harness) -> None:
    """(Moved from tests/e2e/test_sdk.py, where real time had to pass.)"""
    agent = Agent(h)
    await h.create(SPEC + 'approval_ttl = "1s"\n', "agent")
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", lambda r: r["data"]["to"] == "blocked")
    await h.idle()
    await h.call("suspend", name="agent")
    await h.call("approve", name="agent")  # recorded; a suspended session does not run
    gate = await h.call("gate", name="agent")
    assert not any("expired" in c["detail"] for c in gate["checks"])  # not yet
    await h.advance(2)  # the approval's time to live runs out
    gate = await h.call("gate", name="agent")
    assert any("expired" in c["detail"] for c in gate["checks"])
    await h.call("resume", name="agent")
    with contextlib.suppress(RemoteError):
        await h.call("activate", name="agent")
    await h.idle()
    evaluated = (await h.log("agent", types=["gate.evaluated"]))[-1]["data"]
    assert evaluated["ok"] is False
    assert any("expired" in c["detail"] for c in evaluated["checks"])
    assert (await h.call("show", name="agent"))["state"] == "blocked"
    assert agent.work["edits"] == 0


async def test_policy_ask_on_a_command_blocks_until_approved(h: Harness) -> None:
    """(Moved from tests/e2e/test_sdk.py.)"""
    ran: list[str] = []

    @h.program("c")
    async def command(run: FakeRun) -> int:
        ran.append(run.run_id)
        return 0

    spec = 'name = "c"\n[run]\nexec = ["true", "c"]\ncwd = "."\n[policy]\nask = ["command"]\n'
    await h.create(spec, "c")
    await h.call("activate", name="c")
    assert (await h.call("show", name="c"))["state"] == "blocked"
    assert ran == []
    await h.call("approve", name="c")
    await h.event("c", "lifecycle.changed", lambda r: r["data"]["to"] == "terminated")
    await h.idle()
    assert ran == ["r1"]
