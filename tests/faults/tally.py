"""The campaign's counts and the table it prints (tests/faults/campaign.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Tally:
    durability: str = "fsync"
    power_method: str = "simulated"  # or "fault file system"
    sync_interval: float = 1.0
    rounds: int = 0
    power_cuts: int = 0
    fault_points: Counter[str] = field(default_factory=Counter)
    acked_sends: int = 0
    acked_steps: int = 0
    acked_creates: int = 0
    lost: list[str] = field(default_factory=list)
    lost_creates: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    interrupted: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)  # resumed / blocked
    unhandled: list[str] = field(default_factory=list)
    resolved: Counter[str] = field(default_factory=Counter)  # accept / rerun / discard
    answered: Counter[str] = field(default_factory=Counter)  # approve / deny
    self_answers: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # a run's process past the boundary
    secrets: list[str] = field(default_factory=list)
    # the hostile programs' containment (tests/faults/contain.py)
    left_after_stop: list[str] = field(default_factory=list)
    late_work: list[str] = field(default_factory=list)
    unresponsive: list[str] = field(default_factory=list)
    slowest_ping: float = 0.0
    stops: int = 0  # clean stops of the daemon checked
    loss_window: float = 0.0  # durability os: the longest an acknowledged event was lost
    lost_os: int = 0
    executions: int = 0
    keys: int = 0
    reruns: int = 0
    retried: int = 0
    forks: int = 0
    merges: int = 0
    runs: int = 0
    wakes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    no_fault_fs: bool = False  # under CI=true: the fallback power cut is a failure
    sandbox: bool = True  # runs confined (off only for a self-test's break)
    unconfined: list[str] = field(default_factory=list)  # sessions ps shows outside
    begun: list[str] = field(default_factory=list)  # sessions the ledger saw begin work
    idle: list[str] = field(default_factory=list)  # of workload.MUST_WORK: no work ended
    finished: bool = False  # the campaign's end was reached: nothing left to run

    def rows(self) -> list[tuple[str, str, str, bool]]:
        fsync = self.durability == "fsync"
        window_ok = fsync or self.loss_window <= self.sync_interval + 0.5
        handled = self.interrupted - len(self.unhandled)
        return [
            ("acknowledged events lost", str(len(self.lost)) if fsync else "n/a (os)", "0",
             not self.lost),
            ("acknowledged creates lost", str(len(self.lost_creates)) if fsync else "n/a (os)",
             "0", not self.lost_creates),
            ("logs unreadable after repair", str(len(self.unreadable)), "0", not self.unreadable),
            ("a step or an unsafe wake executed twice", str(len(self.twice)), "0",
             not self.twice),
            ("orphan processes after restart", str(len(self.orphans)), "0", not self.orphans),
            ("sessions stuck in running", str(len(self.stuck)), "0", not self.stuck),
            ("processes left after a clean stop", str(len(self.left_after_stop)), "0",
             not self.left_after_stop),
            ("work after its run was stopped (ledger ticks)", str(len(self.late_work)), "0",
             not self.late_work),
            ("pings answered after more than 10 s", str(len(self.unresponsive)), "0",
             not self.unresponsive),
            ("interrupted work handled per its contract", f"{handled} of {self.interrupted}",
             "all", not self.unhandled),
            ("os-mode loss window (s), sync_interval "
             f"{self.sync_interval:g} s", f"{self.loss_window:.2f}" if not fsync else "n/a",
             f"<={self.sync_interval + 0.5:g}", window_ok),
            ("answers given by a run's process", str(len(self.self_answers)), "0",
             not self.self_answers),
            ("secret bytes stored", str(len(self.secrets)), "0", not self.secrets),
            ("run processes outside the boundary (ledger)",
             str(len(self.outside)) if self.sandbox else "n/a (off)", "0",
             not self.sandbox or not self.outside),
            ("sessions whose runs are not confined",
             str(len(self.unconfined)) if self.sandbox else "n/a (off)", "0",
             not self.sandbox or not self.unconfined),
            # the world's record, judged at the end: a campaign whose programs did no
            # work (none started, or none could write) proves nothing
            ("programs that did no work (ledger), at the end", str(len(self.idle)),
             "0", not (self.finished and (self.idle or not self.executions))),
        ]  # fmt: skip

    @property
    def failed(self) -> bool:
        return self.no_fault_fs or not all(ok for *_, ok in self.rows())

    def violations(self) -> list[str]:
        """The names of the invariants that do not hold."""
        return [name for name, _, _, ok in self.rows() if not ok]

    def table(self, seconds: float) -> str:
        wakes = ", ".join(f"{k} {v}" for k, v in sorted(self.wakes.items(), key=lambda kv: -kv[1]))
        points = ", ".join(f"{k} {v}" for k, v in sorted(self.fault_points.items())) or "none"
        lines = [
            f"kill -9 campaign, durability {self.durability}: {self.rounds} rounds in "
            f"{seconds:.0f} s, {self.power_cuts} power cuts ({self.power_method})",
            f"kills at fault points: {points}",
            f"{self.acked_sends} acknowledged sends, {self.acked_steps} acknowledged steps, "
            f"{self.acked_creates} acknowledged creates, {self.runs} runs, {self.forks} forks, "
            f"{self.merges} merges",
            f"steps and command runs: {self.keys} keys, {self.executions} executions "
            f"({self.reruns} after resolve --rerun, {self.retried} retried as their contract "
            "allows)",
            f"cut off by a kill: {self.interrupted} calls; the restart resumed "
            f"{self.verdicts['resumed']}, blocked {self.verdicts['blocked']}; resolved "
            f"--accept {self.resolved['accept']}, --rerun {self.resolved['rerun']}, "
            f"--discard {self.resolved['discard']}; approvals approved "
            f"{self.answered['approve']}, denied {self.answered['deny']}",
            f"wakes by trigger: {wakes}",
            f"sessions whose program began work (ledger): {', '.join(self.begun) or 'none'}",
            f"hostile programs: {self.stops} clean stops checked, slowest ping "
            f"{self.slowest_ping:.2f} s",
            *self.notes,
            "",
            f"{'invariant':<52} {'measured':>12} {'must be':>8}  ok",
        ]
        for name, value, want, ok in self.rows():
            lines.append(f"{name:<52} {value:>12} {want:>8}  {'yes' if ok else 'NO'}")
        for label, items in (
            ("lost", self.lost),
            ("lost create", self.lost_creates),
            ("unreadable", self.unreadable),
            ("executed twice", self.twice),
            ("orphan", self.orphans),
            ("stuck", self.stuck),
            ("left after stop", self.left_after_stop),
            ("worked after stop", self.late_work),
            ("unresponsive", self.unresponsive),
            ("not per contract", self.unhandled),
            ("answered by its own run", self.self_answers),
            ("outside the boundary", self.outside),
            ("secret stored in", self.secrets),
            ("not confined", self.unconfined),
            ("did no work", self.idle if self.finished else []),
        ):
            for item in items[:10]:
                lines.append(f"  {label}: {item}")
        return "\n".join(lines)
