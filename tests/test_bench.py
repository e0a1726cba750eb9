"""The benchmark code runs (tiny sizes, nothing timed is asserted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sessiond.bench import fsinfo, gate, storage
from sessiond.bench.__main__ import check_targets
from tests.helpers import arun


def test_the_storage_benchmarks_run_and_report_sane_figures(tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d", "e"):
        (tmp_path / name).mkdir()
    assert arun(storage.append_os_eps(tmp_path / "a", 200)) > 0
    assert storage.fsync_each_eps(tmp_path / "b", seconds=0.05, max_events=20) > 0
    eps, fsyncs = arun(storage.group_commit_eps(tmp_path / "c", 4, 0.2))
    assert eps > 0
    assert fsyncs > 0
    replay, floor = arun(storage.replay_eps(tmp_path / "d", 3000, repeats=1))
    assert replay > 0
    assert floor > 0
    assert arun(storage.snapshot_resume_ms(tmp_path / "e", 3000, tail=50, repeats=1)) > 0
    (tmp_path / "f").mkdir()
    warm, cold, floor = arun(gate.gate_ms(tmp_path / "f", 20, repeats=2, size=64))
    assert warm > 0
    assert cold > 0
    assert floor > 0
    assert fsinfo.fs_type(tmp_path) != ""
    assert fsinfo.fsync_median_ms(tmp_path, samples=3) >= 0


def test_the_context_benchmark_stores_a_conversation_both_ways(tmp_path: Path) -> None:
    from sessiond.bench import contexts

    figures = contexts.measure_calls(tmp_path, 30, size=800)
    assert figures["context_30_whole_bytes"] > figures["context_30_chunked_bytes"] > 0
    assert figures["context_30_ratio"] > 1
    assert figures["context_30_whole_put_p50_ms"] > 0


def test_targets_are_judged_in_their_direction() -> None:
    verdicts = check_targets({"replay_eps": 500_000, "snapshot_resume_ms": 150.0})
    assert verdicts["replay_eps"]["met"] is True
    assert verdicts["snapshot_resume_ms"]["met"] is False
    assert "append_os_eps" not in verdicts


def test_the_wake_and_sdk_benchmarks_run(tmp_path: Path) -> None:
    from sessiond.bench.daemon import wake_and_sdk

    work = Path(__import__("tempfile").mkdtemp(prefix="sdb-", dir="/tmp"))  # short socket path
    try:
        figures = wake_and_sdk(work, quick=True)
    finally:
        __import__("shutil").rmtree(work, ignore_errors=True)
    assert figures["wake_to_exec_p50_ms"] > 0
    assert figures["sdk_tool_roundtrip_p50_ms"] > 0


def test_the_startup_benchmark_runs() -> None:
    from sessiond.bench import startup

    work = Path(__import__("tempfile").mkdtemp(prefix="sdb-", dir="/tmp"))  # short socket path
    try:
        figures = startup.measure(work, True, lambda _text: None, count=20, repeats=1)
    finally:
        __import__("shutil").rmtree(work, ignore_errors=True)
    assert figures["startup_sessions"] == 20
    assert 0 < figures["startup_ping_clean_s"] <= figures["startup_ps_clean_s"]
    assert figures["full_recovery_kill9_s"] > 0
    assert figures["recovery_floor_s"] > 0
    # the bound's index read as the early server reads it, beside the bound
    # (20 sessions: under a millisecond, which the figures' rounding may make 0)
    assert figures["index_read_gc_off_s"] >= 0
    assert figures["startup_first_answer_ratio_gc_off"] > 0
    # beside the ratio of medians, the median of each round's own ratio to the
    # bound measured around its starts (the rounds' ratios are not figures)
    assert figures["startup_first_answer_ratio_paired"] > 0
    assert not [name for name in figures if name.endswith("_ratio_paired") and "_ps_" in name]


def test_the_concurrent_commit_benchmark_runs() -> None:
    from sessiond.bench import commits

    work = Path(__import__("tempfile").mkdtemp(prefix="sdb-", dir="/tmp"))  # short socket path
    try:
        figures = commits.measure(work, quick=True, seconds=0.2)
    finally:
        __import__("shutil").rmtree(work, ignore_errors=True)
    assert figures["send_4x4_eps"] > 0
    assert figures["fsync_4_loops_eps"] > 0
    assert figures["send_4x4_ratio"] > 0
    # the thread form, beside the process form, in the same rounds
    assert figures["send_4x4_threads_eps"] > 0
    assert figures["fsync_4_loops_threads_eps"] > 0


def test_the_load_benchmark_runs_without_errors() -> None:
    from sessiond.bench import load

    result = load.run(clients=20, seconds=1.0, sessions=30, say=lambda _text: None)
    assert result["errors"] == 0, result["first_errors"]
    assert result["requests"] > 0
    assert result["running_during_load"] == load.RUNNERS
    assert result["running_after_load"] == load.RUNNERS
    assert set(result["per_method"]) <= {"show", "ping", "log", "send", "ps"}


def test_every_comparison_runs_and_renders_one_table(tmp_path: Path) -> None:
    """Each side of each comparison runs at a tiny size; the rows against supervisord
    run only where supervisor is installed (the `bench` extra)."""
    import shutil
    import tempfile

    from sessiond.bench import compare

    tiny = compare.Sizes(
        ps_units=(2, 3), repeats=1, stop_programs=2, rounds=1, fsync_seconds=0.05,
        group_seconds=0.1, writers=4, encode_events=100, replay_events=2000,
        replay_repeats=1, wake_samples=2,
    )  # fmt: skip
    with_supervisor = shutil.which("supervisord", path=str(compare.BIN)) is not None
    root = Path(tempfile.mkdtemp(prefix="cmp-", dir="/tmp"))  # short socket paths
    try:
        rows = compare.run(root, tmp_path, tiny, lambda _text: None, supervisor=with_supervisor)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    keys = [row.key for row in rows]
    expected = ["group_commit", "encoding", "replay", "watch_wake", "git_wake"]
    if with_supervisor:
        expected = ["ps_2", "ps_3", "stop_2", *expected]
    assert keys == expected
    assert all(row.ours > 0 and row.theirs > 0 and row.seconds >= 0 for row in rows), rows
    by_key = {row.key: row for row in rows}
    if with_supervisor:
        assert by_key["ps_3"].target is None  # the ps target is stated at 300 units
    assert by_key["group_commit"].target == (">=", 10.0)
    assert isinstance(by_key["git_wake"].met, bool)
    lines = compare.render(rows)
    assert len(lines[0].split("  ")) > 1
    assert [r.what for r in rows] == [line.split("  ")[0] for line in lines[2 : 2 + len(rows)]]
    assert all(float(str(row.as_dict()["ratio"])) > 0 for row in rows)


def test_the_loop_benchmark_runs() -> None:
    from sessiond.bench import loop

    work = Path(__import__("tempfile").mkdtemp(prefix="sdb-", dir="/tmp"))  # short socket path
    try:
        figures: dict[str, Any] = loop.measure(work, quick=True, say=lambda _text: None, events=300)
    finally:
        __import__("shutil").rmtree(work, ignore_errors=True)
    for op in loop.OPS:
        assert figures[f"loop_{op}_pings"] >= 1
        assert figures[f"loop_{op}_ping_p99_ms"] > 0
    for op in ("replay", "fork"):
        assert figures[f"loop_{op}_hold_max_ms"] > 0


def test_the_memory_benchmark_runs_on_state_written_offline() -> None:
    """Sessions written beside their snapshots load from them (a warm start), the long
    session also cold; each figure is there (nothing timed or sized is asserted)."""
    import shutil
    import tempfile

    from sessiond.bench import memory

    root = Path(tempfile.mkdtemp(prefix="mem-", dir="/tmp"))  # short socket paths
    try:
        warm = memory.daemon_rss(root / "a", 3, 300, cold=False)
        cold = memory.daemon_rss(root / "b", 1, 300, cold=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert warm["mb"] > 0
    assert warm["snapshots_mb"] > 0  # the offline snapshots (a clean stop keeps them)
    assert cold["cold_mb"] > 0
    assert cold["mb"] > 0


def test_the_gateway_benchmark_helpers() -> None:
    from sessiond.bench import run_async
    from sessiond.bench.gateway import _sched, jain

    assert jain([5, 5, 5, 5]) == 1.0
    assert jain([8, 0, 0, 0]) == 0.25
    assert run_async(lambda: _sched(None, 3)) > 0
    assert run_async(lambda: _sched(2, 3)) > 0
