"""The client benchmark's code runs (nothing timed is asserted)."""

from __future__ import annotations

import os
import sys

import pytest

from sessiond.bench import client


def test_interleaved_runs_each_program_and_gives_medians() -> None:
    env = dict(os.environ)
    figures = client.interleaved(
        {"bare": ([sys.executable, "-c", "pass"], env), "floor": (client.FLOOR, env)}, 2
    )
    assert set(figures) == {"bare", "floor"}
    for wall, cpu in figures.values():
        assert wall > 0
        assert cpu >= 0


def test_a_program_that_fails_is_no_figure() -> None:
    with pytest.raises(RuntimeError, match="exited 3"):
        client.run_once([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
