"""The hot loop of :func:`sessiond.log.replay.replay`: the fold of a list of records.

A tool call's five events are most of a busy session's log; they are folded here
(the same fold as their handlers in log.replay, which ``apply`` uses) with no
handler call, and the state's containers bound once per list. The state left is
exactly the one the handlers leave record by record
(tests/log/test_fold_equivalence.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sessiond.log.event_records import EventRecord, ToolFinishedData, ToolStartedData
from sessiond.log.events import CURRENT_VERSION, upcast
from sessiond.log.records import CallRecord
from sessiond.log.state import TRANSCRIPT_KEEP, State

Handler = Callable[[State, EventRecord, Any], None]

# A plain dict: faster than the read-only mapping in the loop below.
_VERSIONS: dict[str, int] = dict(CURRENT_VERSION)

# The kinds of a tool call's five events, one event in five each of a busy session.
_INTENT, _DECIDED, _STARTED, _FINISHED, _OBSERVED = range(5)
_HOT: dict[str, int] = {
    "tool.intent": _INTENT,
    "policy.decided": _DECIDED,
    "tool.started": _STARTED,
    "tool.finished": _FINISHED,
    "observation.projected": _OBSERVED,
}
_V1 = 1  # the current version of each of them
assert all(_VERSIONS[kind] == _V1 for kind in _HOT), "a hot kind's version changed"
STEP = 64  # records ``replay`` takes at a time from an iterator (not a list)


def call_of(s: State, d: ToolStartedData | ToolFinishedData) -> CallRecord:
    """The call an event belongs to; a call whose intent predates the log (a log cut
    by fork or import mid-call) is recorded from what this event says."""
    call = s.calls.get(d["call"])
    if call is None:
        call = s.calls[d["call"]] = {
            "call": d["call"],
            "tool": d["tool"],
            "args": {},
            "risk": None,
            "writes": [],
            "stage": "intent",
            "seq": None,
        }
    return call


def replay_rows(  # noqa: PLR0915 - one loop, the hot kinds inline (no call per event)
    rows: list[EventRecord], s: State, handlers: Mapping[str, Handler]
) -> State:
    """``replay`` of a list, with the fold's ``handlers`` (log.replay).

    While no turn is open (a turn's steps are kept by the handlers, log.turns), a
    tool call's events are folded here, and a call whose five events come in a row
    (the common case) is folded at once: what they leave is what the last one
    leaves (the call's record is gone again), so that record is never built."""
    version = _VERSIONS.get
    hot = _HOT.get
    # Never rebound by any handler (only filled and emptied): bound once.
    calls = s.calls
    get_call = calls.get
    file_hashes = s.file_hashes
    n = len(rows)
    i = 0
    while i < n:
        record = rows[i]
        i += 1
        etype = record["type"]
        if record["v"] != version(etype):
            record = upcast(record)
        d: Any = record["data"]
        kind = hot(etype)
        if kind is None or s.turn is not None:
            handlers[etype](s, record, d)
            continue
        if kind == _INTENT:
            call = d["call"]
            if i + 4 <= n:
                a, b, f, o = rows[i], rows[i + 1], rows[i + 2], rows[i + 3]
                od = o["data"]
                if (
                    o["type"] == "observation.projected"
                    and a["type"] == "policy.decided"
                    and b["type"] == "tool.started"
                    and f["type"] == "tool.finished"
                    and od["call"] == call
                    and a["data"]["call"] == call
                    and b["data"]["call"] == call
                    and f["data"]["call"] == call
                    and a["v"] == _V1
                    and b["v"] == _V1
                    and f["v"] == _V1
                    and o["v"] == _V1
                ):
                    i += 4
                    s.tool_calls += 1
                    s.tool_calls_this_run += 1
                    d = f["data"]
                    if d["hashes"]:
                        file_hashes.update(d["hashes"])
                    if d["output"]:
                        s.artifacts_seen += 1
                    if d["diff"]:
                        s.artifacts_seen += 1
                    d, record = od, o
                    kind = _OBSERVED  # and on to the observation's fold below
            if kind == _INTENT:
                calls[call] = {
                    "call": call,
                    "tool": d["tool"],
                    "args": d["args"],
                    "risk": d["risk"],
                    "writes": d["writes"],
                    "stage": "intent",
                    "seq": record["seq"],
                }
                s.tool_calls += 1
                s.tool_calls_this_run += 1
                continue
        if kind == _OBSERVED:
            call, tool, text, seq = d["call"], d["tool"], d["text"], record["seq"]
            calls.pop(call, None)
            if s.approvals:
                s.approvals.pop(call, None)
            s.last_observation = {"seq": seq, "call": call, "tool": tool, "text": text}
            transcript = s.transcript  # (rebound by a compaction)
            transcript.append({"seq": seq, "role": "tool", "kind": "observation", "text": text,
                               "tool": tool, "call": call})  # fmt: skip
            if len(transcript) > TRANSCRIPT_KEEP:
                del transcript[0]
        elif kind == _DECIDED:
            c = get_call(d["call"])
            if c is not None:
                decision = c["decision"] = d["decision"]
                c["rule"] = d["rule"]
                c["stage"] = "denied" if decision == "deny" else "decided"
        elif kind == _STARTED:
            c = get_call(d["call"]) or call_of(s, d)
            c["stage"] = "started"
            c["started"] = d
            c["started_seq"] = record["seq"]
        else:  # _FINISHED
            c = get_call(d["call"]) or call_of(s, d)
            c["stage"] = "finished"
            c["finished"] = d
            c["finished_seq"] = record["seq"]
            if d["hashes"]:
                file_hashes.update(d["hashes"])
            if d["output"]:
                s.artifacts_seen += 1
            if d["diff"]:
                s.artifacts_seen += 1
    if n:
        last = rows[-1]
        s.seq = last["seq"]
        s.last_id = last["id"]
        s.last_ts = last["ts"]
    return s
