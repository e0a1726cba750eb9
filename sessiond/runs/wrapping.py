"""An SDK model step that wraps a call through the model gateway (docs/design.md
section 14, "Spent once").

A program may wrap an official client's call in ``run.model_call``; the client
calls the gateway, which records the same call as its own step (``gw.<n>``). Both
would count its tokens. The gateway always records: it is the one place that sees
every call, whatever the framework. So the SDK's step records that it wrapped the
gateway's steps (``model.responded`` ``wrapped``) and counts no tokens, cost or text
of its own; a model step that called nothing through the gateway (a direct call, a
run without the gateway) counts its own as before.

A gateway step is wrapped by the run's SDK model steps under way when it is called
(the frame of their ``fn``; a program's calls come from inside it), and by the step
whose result is the gateway's response (the same provider response id: a response
got before the step and handed to it). Every run keeps this in memory only: a crash
before the SDK step's end leaves it started and not finished, and the next run
asks it again, where the gateway answers its call from the log (no upstream call)
and the step records the wrap again.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sessiond.runs.tokens import RunGrant

# The gateway's latest responses to a run known by id (an agent CLI's run makes
# thousands of calls and wraps none)
KEEP_IDS = 256


def opened(grant: RunGrant, call: str) -> None:
    """An SDK model step of the run answered ``run``: its ``fn`` is under way."""
    grant.model_frames[call] = len(grant.gateway_called)


def called(grant: RunGrant, key: str) -> None:
    """A call of the run became the gateway's step ``key`` (``gw.<n>``: sent, or
    answered from the log): every SDK model step under way wraps it. (Steps run at
    once each wrap the calls made meanwhile; a concurrent one that also calls a model
    some other way counts none of its own then: the gateway's record counts the calls
    it saw.)

    Noted once, whatever the number of steps under way: each step reads the calls
    made since it began when it ends. (A list of its own for each step cost every
    call a pass over every open step and its list: a program that opened thousands
    of steps and then called the gateway thousands of times held the daemon's loop
    for seconds a call, and its memory grew with the product.)"""
    if grant.model_frames:  # nobody under way: nobody wraps it
        grant.gateway_called.append(key)


def answered(grant: RunGrant, key: str, response: Any) -> None:
    """The gateway answered the run's call at ``key`` with ``response`` (sent
    upstream or from the log): known by its provider response id."""
    rid = response.get("id") if isinstance(response, dict) else None
    if isinstance(rid, str) and rid:
        ids = grant.gateway_ids
        ids.pop(rid, None)  # (the newest last)
        ids[rid] = key
        if len(ids) > KEEP_IDS:  # a response is handed to a step soon after, if ever
            del ids[next(iter(ids))]


def wrapped(grant: RunGrant, call: str, result: Any) -> tuple[str, ...]:
    """The gateway steps the SDK model step ``call`` wrapped, as it ends."""
    began = grant.model_frames.pop(call, None)
    calls = grant.gateway_called
    keys = [] if began is None else list(dict.fromkeys(calls[began:]))
    if not grant.model_frames:
        calls.clear()  # no step under way reads it any more
    rid = result.get("id") if isinstance(result, dict) else None
    mine = grant.gateway_ids.get(rid) if isinstance(rid, str) else None
    if mine is not None and mine not in keys:
        keys.append(mine)
    return tuple(sorted(keys, key=_order))


class Own(TypedDict, total=False):
    """What a model step's ``model.responded`` counts of its own."""

    tokens_in: int
    tokens_out: int
    cost_usd: float | None
    text: str
    wrapped: tuple[str, ...]


def spend(p: Any, ok: bool, wraps: tuple[str, ...]) -> Own:
    """A model step's own tokens, cost and text for ``model.responded``: none where it
    wrapped the gateway's steps (``wraps``), which record them; the text is masked as
    it is appended."""
    if wraps:
        return {"tokens_in": 0, "tokens_out": 0, "cost_usd": None, "text": "", "wrapped": wraps}
    return {"tokens_in": p.tokens_in, "tokens_out": p.tokens_out,
            "cost_usd": p.cost_usd if ok else None, "text": p.text if ok else ""}  # fmt: skip


def _order(key: str) -> tuple[int, str]:
    n = key[3:]
    return (int(n), key) if key.startswith("gw.") and n.isdigit() else (0, key)
