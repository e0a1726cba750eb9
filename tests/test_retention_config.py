"""``[retention]`` in the daemon configuration: every rule off by default, each
value checked and refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.config import BadConfig, RetentionConfig, load_config


def load(tmp_path: Path, text: str) -> RetentionConfig:
    path = tmp_path / "sessiond.toml"
    path.write_text(text)
    return load_config(path, env={}).retention


def test_nothing_is_removed_unless_a_rule_is_set(tmp_path: Path) -> None:
    retention = load_config(None, env={}).retention
    assert retention.rules() == []
    assert retention.interval is None


def test_the_rules_take_durations_and_counts(tmp_path: Path) -> None:
    retention = load(
        tmp_path,
        '[retention]\nterminated = "30d"\nunreferenced = "1h"\nkeep_artifacts = 100\n'
        'snapshots = 1\ninterval = "6h"\n',
    )
    assert retention == load_config(None, env={}).retention.model_copy(
        update={
            "terminated": 30 * 86400.0,
            "unreferenced": 3600.0,
            "keep_artifacts": 100,
            "snapshots": 1,
            "interval": 6 * 3600.0,
        }
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("snapshots = 0", "retention.snapshots"),  # the newest one always stays
        ("keep_artifacts = -1", "retention.keep_artifacts"),
        ("terminated = nan", "retention.terminated"),
        ('terminated = "-1d"', "retention.terminated"),
        ('unreferenced = "soon"', "retention.unreferenced"),
        ('interval = "0s"', "retention.interval"),
        ("interval = inf", "retention.interval"),
        ("keep = 3", "retention.keep: unknown key"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "sessiond.toml"
    path.write_text(f"[retention]\n{text}\n")
    with pytest.raises(BadConfig, match=named):
        load_config(path, env={})
