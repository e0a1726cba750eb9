"""``sessionctl models``: the model gateway's providers, their limits and what they
hold now, the calls waiting for the model, and what each session and agent spent
today (a UTC day)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sessiond.ctl.render import Out, table
from sessiond.ctl.safeterm import terminal_safe
from sessiond.wire import Connection

# the reply types, for mypy only: sessionctl starts without building them
if TYPE_CHECKING:
    from sessiond.replies import (
        AgentSpent,
        LimitUse,
        ModelsReply,
        ProviderUse,
        QueuedCall,
        SessionSpent,
    )


def _of(used: Any, limit: Any) -> str:
    """``used/limit``, or ``used`` where there is no limit."""
    return f"{used}/{limit}" if limit else str(used)


def _money(value: float) -> str:
    return f"${value:.4f}" if value else "-"


def providers_table(providers: list[ProviderUse]) -> list[list[str]]:
    cells = [["PROVIDER", "KIND", "MODELS", "IN FLIGHT", "REQ/MIN", "TOKENS/MIN", "THROTTLES",
              "PAUSED"]]  # fmt: skip
    for p in providers:
        rows: list[tuple[str, str, str, LimitUse]] = [
            (p["name"], p.get("kind") or "-", ",".join(p.get("models") or []) or "-", p)
        ]
        rows += [("  " + m["key"], "", "", m) for m in p.get("model_limits") or []]
        for name, kind, models, lim in rows:
            conc = lim.get("learned_concurrency") or lim.get("concurrency")
            paused = lim.get("paused_for") or 0
            cells.append(
                [
                    name,
                    kind,
                    models,
                    _of(lim.get("in_flight", 0), conc),
                    _of(lim.get("requests_last_minute", 0), lim.get("rpm")),
                    _of(lim.get("tokens_last_minute"), lim.get("tpm"))
                    if lim.get("tokens_last_minute") is not None
                    else "-",
                    str(lim.get("throttles", 0)),
                    f"{paused:g}s" if paused else "-",
                ]
            )
    return cells


def queue_table(queue: list[QueuedCall]) -> list[list[str]]:
    cells = [["AHEAD", "SESSION", "AGENT", "PRI", "PROVIDER", "MODEL", "WAITED"]]
    for q in queue:
        cells.append(
            [
                str(q["ahead"]),
                q["session"],
                q.get("agent") or "-",
                str(q["priority"]),
                q["provider"],
                q["model"],
                f"{q['waited']:.1f}s",
            ]
        )
    return cells


def spend_table(rows: Sequence[SessionSpent] | Sequence[AgentSpent]) -> list[list[str]]:
    by_session = any("session" in r for r in rows)
    head = "SESSION" if by_session else "AGENT"
    cells = [[head, *(["AGENT"] if by_session else ["SESSIONS"]), "TOKENS", "COST"]]
    for r in rows:
        if "session" in r:
            name, second = r["session"], r["agent"] or "-"
        else:
            name, second = r["agent"], str(r["sessions"])
        cells.append(
            [
                name,
                second,
                _of(r["tokens"], r.get("tokens_per_day")),
                _money(r["cost_usd"])
                + (f" of {_money(r['cost_usd_per_day'])}" if r.get("cost_usd_per_day") else ""),
            ]
        )
    return cells


def cmd_models(conn: Connection, _args: argparse.Namespace, out: Out) -> int:
    reply: ModelsReply = conn.call("models", {})
    if out.json:
        out.emit_json(reply)
        return 0
    d: ModelsReply = terminal_safe(reply)  # a model's name is what a program asked for
    if d["providers"]:
        table(providers_table(d["providers"]), out, colour_col=None)
    else:
        print("no model providers: add [[model.provider]] to the daemon's configuration")
    served, throttled = d.get("served", 0), d.get("throttled", 0)
    print(f"\ncalls served: {served}, throttled by the provider and retried: {throttled}")
    queue = d["queue"]
    print(f"\nwaiting for the model: {len(queue)}")
    if queue:
        table(queue_table(queue), out, colour_col=None)
    print(f"\nspent today ({d['day']} UTC), by session:")
    if d["sessions"]:
        table(spend_table(d["sessions"]), out, colour_col=None)
    else:
        print("nothing yet")
    if d["agents"]:
        print("\nby agent:")
        table(spend_table(d["agents"]), out, colour_col=None)
    return 0


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    add(
        "models",
        cmd_models,
        "the model gateway: each provider's limits and their use now (calls in flight, "
        "requests and tokens in the last minute, 429s absorbed), the calls waiting for "
        "the model, and what each session and agent spent today (UTC)",
    )
