"""How ``gate`` and ``show`` tell a person why a session is blocked and which
answers would change it: the daemon's list (sessiond.table.recovery), never a
fixed set of options."""

from __future__ import annotations

# the reply types and typing, for mypy only: sessionctl starts without them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from sessiond.replies import CauseView, GateReport


def _commands(name: str, cause: CauseView) -> list[str]:
    said = [f"sessionctl {a} {name}" for a in cause.get("answers") or []]
    return said + [f"sessionctl resolve {name} --{o}" for o in cause.get("options") or []]


def recover_lines(report: GateReport) -> list[tuple[str, str]]:
    """(key, value) lines: each cause, then what would change it."""
    name = report["session"]
    lines: list[tuple[str, str]] = []
    # (a spent budget suspends: it renews, or a larger one is applied)
    key = "blocked by" if report.get("outcome", "blocked") == "blocked" else "waits on"
    for cause in report.get("causes") or []:
        lines.append((key, f"{cause['kind']}: {cause['detail']}"))
        doing = _commands(name, cause)
        todo = cause.get("todo") or ""
        if doing:
            lines.append(("recover", ", ".join(doing) + (f" ({todo})" if todo else "")))
        else:
            lines.append(("recover", f"no answer changes it: {todo}" if todo else "nothing to do"))
    return lines


def gate_text(report: GateReport, paint: Any) -> list[str]:
    """``sessionctl gate``: the checks, then the verdict and what would change it."""
    lines = []
    for check in report["checks"]:
        mark = paint("ok  ", "32") if check["ok"] else paint("FAIL", "31;1")
        lines.append(f"{mark} {check['name']}: {check['detail']}")
    if report["ok"]:
        return [*lines, "ok: the session may continue"]
    options = ", ".join(f"--{o}" for o in report.get("options") or [])
    lines.append(f"not ok: recovery options {options}" if options else "not ok")
    return lines + [f"{key}: {value}" for key, value in recover_lines(report)]
