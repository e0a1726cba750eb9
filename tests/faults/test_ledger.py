"""The campaign's checks see a violation when there is one (unit tests of the
ledger rules and of the verdict table; tests/faults/ledger.py, checks.py)."""

from __future__ import annotations

from typing import Any

from tests.faults.checks import judge_verdict
from tests.faults.ledger import judge, may_rerun_alone

UNSAFE = "unsafe/require-user-confirmation/workspace-write"
SAFE = "safe/replay-from-event/read"


def test_the_risk_table_lets_only_checkable_work_rerun_alone() -> None:
    assert may_rerun_alone(SAFE)
    assert may_rerun_alone("conditional/rerun-after-check/workspace-write")
    assert not may_rerun_alone(UNSAFE)
    assert not may_rerun_alone("conditional/never-rerun/workspace-write")
    assert not may_rerun_alone("safe/rerun-after-check/external-write")


def test_a_cut_off_unsafe_step_begun_again_with_no_rerun_is_executed_twice() -> None:
    judged = judge([f"begin a.t1.2 {UNSAFE}", f"begin a.t1.2 {UNSAFE}"])
    assert judged.twice == [f"a.t1.2 ({UNSAFE}) ran 2 times with no resolve --rerun"]
    assert judged.interrupted == 1


def test_a_rerun_a_person_ordered_allows_exactly_one_more_execution() -> None:
    lines = [f"begin a.t1.2 {UNSAFE}", "rerun a", f"begin a.t1.2 {UNSAFE}"]
    judged = judge(lines)
    assert (judged.twice, judged.reruns) == ([], 1)
    assert judge([*lines, f"begin a.t1.2 {UNSAFE}"]).twice  # one rerun, one execution
    assert judge([f"begin a.t1.2 {UNSAFE}", "rerun a", "unrerun a", f"begin a.t1.2 {UNSAFE}"]).twice
    assert judge([f"begin a.t1.2 {UNSAFE}", "rerun b", f"begin a.t1.2 {UNSAFE}"]).twice


def test_an_acknowledged_step_never_runs_again_whatever_its_contract() -> None:
    judged = judge([f"begin a.t1.1 {SAFE}", "end a.t1.1", "ack a.t1.1", "rerun a",
                    f"begin a.t1.1 {SAFE}"])  # fmt: skip
    assert judged.twice == ["a.t1.1 ran again after its finish was acknowledged"]


def test_a_safe_step_cut_off_may_run_again_by_itself() -> None:
    judged = judge([f"begin a.t1.1 {SAFE}", f"begin a.t1.1 {SAFE}", "end a.t1.1"])
    assert (judged.twice, judged.retried, judged.interrupted) == ([], 1, 0)


def test_a_command_run_is_keyed_by_its_turn() -> None:
    contract = "unsafe/require-user-confirmation/workspace-write"
    judged = judge([f"begin c.t3 {contract}", f"begin c.t4 {contract}", "end c.t4"])
    assert (judged.keys, judged.twice, judged.interrupted) == (2, [], 1)


def verdict(ok: bool, options: list[str]) -> dict[str, Any]:
    outcome = "ok" if ok else "blocked"
    return {"seq": 9, "data": {"ok": ok, "outcome": outcome, "options": options}}


def test_a_restart_that_resumes_cut_off_unsafe_work_breaks_its_contract() -> None:
    calls = {"c1": UNSAFE}
    outcome, wrong = judge_verdict(calls, verdict(True, []))
    assert outcome == "resumed"
    assert wrong is not None
    assert "resumed with no person" in wrong
    assert judge_verdict(calls, verdict(False, ["rerun", "discard", "accept"])) == ("blocked", None)
    assert judge_verdict({"c1": SAFE}, verdict(True, [])) == ("resumed", None)
    assert judge_verdict(calls, None)[1] == "no gate verdict after the restart"
