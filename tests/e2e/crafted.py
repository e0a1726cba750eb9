"""Sessions in states the daemon cannot reach by itself yet (pending approvals come
from SDK programs), written as bundles with the library and imported for real."""

from __future__ import annotations

from pathlib import Path

from sessiond.log.bundle import export_session
from sessiond.log.event_data import (
    ApprovalRequested,
    EventData,
    LifecycleChanged,
    PolicyDecided,
    RiskContract,
    SessionCreated,
    ToolIntent,
)
from sessiond.log.journal import Journal
from sessiond.log.store.files import FileStore
from tests.helpers import arun


def bundle_with_pending_approvals(folder: Path, calls: tuple[str, str] = ("c1", "c2")) -> Path:
    """A bundle of session ``asker``, blocked on two approvals (their call ids:
    ``calls``; a bundle from elsewhere chooses them)."""
    store = FileStore(folder / "craft")

    async def go() -> None:
        await (await store.create("asker", spec='name = "asker"\n')).close()
        journal = await Journal.open(store, "asker")
        events: list[EventData] = [SessionCreated(name="asker", goal="ask twice")]
        for call, tool in zip(calls, ("edit_file", "send_email"), strict=True):
            events += [
                ToolIntent(call=call, tool=tool, risk=RiskContract(side_effect="external-write")),
                PolicyDecided(call=call, tool=tool, decision="ask", rule=f"ask: {tool}"),
                ApprovalRequested(call=call, tool=tool),
            ]
        events.append(
            LifecycleChanged(from_state="created", to="blocked", reason="approval pending")
        )
        for event in events:
            await journal.append(event)
        await journal.close()

    arun(go())
    out = folder / "asker.bundle"
    export_session(store, "asker", out)
    return out
