"""``sessionctl show``'s text: one session in detail, a line per fact."""

from __future__ import annotations

from sessiond.ctl import answers
from sessiond.ctl.render import STATE_COLOURS, Out, ago, when
from sessiond.describe import exited

# the reply types, for mypy only: sessionctl starts without building them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from sessiond.replies import SessionDetail


def print_detail(d: SessionDetail, out: Out) -> None:
    state = d["state"] + (f" ({d['outcome']})" if d.get("outcome") else "")
    program = d.get("program")
    lines = [
        ("session", d["name"]),
        ("state", out.paint(state, STATE_COLOURS.get(d["state"], "0"))),
        ("reason", d.get("reason") or "-"),
        ("goal", d.get("goal") or "-"),
        ("agent", d.get("agent") or "-"),
        ("priority", str(d.get("priority", 0))),
        ("program", " ".join(program) if program else "(none)"),
        ("triggers", "; ".join(d.get("triggers") or []) or "(none)"),
        ("next wake", when(d.get("next_wake"))),
        ("runs", str(d.get("runs", 0))),
        ("pid", str(d["pid"]) if d.get("pid") else "-"),
        ("boundary", answers.boundary(d)),
        ("created", ago(d.get("created_at"))),
        ("last active", ago(d.get("last_active"))),
        # a cluster's session no live node runs: its log is not read here
        ("events", "not known here" if d.get("seq") is None else str(d["seq"])),
    ]
    gate = d.get("last_gate")
    if gate:
        verdict = "ok" if gate.get("ok") else "NOT ok"
        # a gate passed before the session was blocked since (a run failed): say so
        before = ", before the block" if gate.get("ok") and d["state"] == "blocked" else ""
        lines.append(("last gate", f"{verdict} (seq {gate.get('seq')}{before})"))
    turn = d.get("turn")
    if turn:
        steps = ", ".join(f"{n} {status}" for status, n in sorted(turn["steps"].items()))
        lines.append(
            ("turn", f"{turn['n']} open: run {turn['runs']}, steps: {steps or 'none yet'}")
        )
    for a in d.get("pending_approvals") or []:
        lines.append(("approval", f"pending: {a['tool']} [call {a['call']}]"))
    for a in d.get("answered_approvals") or []:
        lines.append(
            ("approval", f"{a['status']}: {a['tool']} [call {a['call']}] {answers.who(a)}")
        )
    recovery = d.get("last_recovery")
    if recovery:
        lines.append(("resolved", f"--{recovery['option']} {answers.who(recovery)}"))
    for c in d.get("tools_in_flight") or []:
        lines.append(("in flight", f"{c['tool']} [call {c['call']}]"))
    if d.get("parent"):
        at = f" (forked at seq {d['fork_seq']})" if d.get("fork_seq") is not None else ""
        lines.append(("parent", f"{d['parent']}{at}"))
    if d.get("children"):
        lines.append(("children", ", ".join(d["children"])))
    if d.get("merged"):
        lines.append(("merged", ", ".join(d["merged"])))
    used = d.get("budget_used")
    if used and (used.get("tokens") or used.get("cost_usd")):
        cost = f", cost ${used['cost_usd']:.4f}" if used.get("cost_usd") else ""
        lines.append(("used", f"{used['tokens']} tokens{cost}"))
    last_run = d.get("last_run")
    if last_run:
        lines.append(
            (
                "last run",
                f"{last_run['run']} {last_run['status']}{exited(last_run.get('exit_code'))}",
            )
        )
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key.rjust(width)}: {value}")
