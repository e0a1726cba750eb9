"""Daemon configuration keys that need more than their type: ``sync_interval``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.config import BadConfig, load_config


def _load(tmp_path: Path, text: str) -> float:
    path = tmp_path / "sessiond.toml"
    path.write_text(f'state_dir = "state"\n{text}')
    return load_config(path, env={}).sync_interval


def test_sync_interval_defaults_to_a_second_and_takes_durations(tmp_path: Path) -> None:
    assert _load(tmp_path, "") == 1.0
    assert _load(tmp_path, 'sync_interval = "200ms"\n') == pytest.approx(0.2)


@pytest.mark.parametrize("value", ['"0s"', '"2h"', '"soon"'])
def test_a_sync_interval_out_of_range_is_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(BadConfig, match="sync_interval"):
        _load(tmp_path, f"sync_interval = {value}\n")
