"""The daemon configuration (sessiond/config.py): numbers that are not finite are
refused naming the key, the paths handed to programs are absolute, and
``sync_interval`` is bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sessiond.config import BadConfig, load_config


def refusal(text: str, tmp_path: Path) -> str:
    path = tmp_path / "sessiond.toml"
    path.write_text(text)
    with pytest.raises(BadConfig) as caught:
        load_config(path, env={})
    return str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("shutdown_grace", "nan"),
        ("stop_grace", "inf"),
        ("read_timeout", "-inf"),
        ("aging", "nan"),
        ("aging", "inf"),
    ],
)
def test_a_duration_that_is_not_finite_is_refused_naming_the_key(
    key: str, value: str, tmp_path: Path
) -> None:
    message = refusal(f"{key} = {value}\n", tmp_path)
    assert message == (
        f"{tmp_path}/sessiond.toml: {key}: {value} is not a duration: write a finite number "
        "of seconds or text like '10m', '200ms', '1h30m'"
    )


@pytest.mark.parametrize("value", ['"nan"', '"inf"', '"1e999s"', f'"{"9" * 400}s"', "1e300"])
def test_a_duration_written_as_text_or_too_long_is_refused(value: str, tmp_path: Path) -> None:
    message = refusal(f"read_timeout = {value}\n", tmp_path)
    assert message.startswith(f"{tmp_path}/sessiond.toml: read_timeout: ")
    assert "duration" in message


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300"])
def test_a_clock_offset_that_is_not_finite_is_refused(value: str, tmp_path: Path) -> None:
    message = refusal(f"clock_offset = {value}\n", tmp_path)
    assert message.startswith(f"{tmp_path}/sessiond.toml: clock_offset: ")
    assert "write a number of seconds within 100 years" in message


def test_a_whole_number_that_is_not_finite_is_refused_with_the_value(tmp_path: Path) -> None:
    message = refusal("snapshot_every = nan\n", tmp_path)
    assert message.startswith(f"{tmp_path}/sessiond.toml: snapshot_every: ")
    assert message.endswith("(got nan)")


def test_finite_values_still_load(tmp_path: Path) -> None:
    path = tmp_path / "sessiond.toml"
    path.write_text('aging = "2m"\nclock_offset = -86400\nstop_grace = 1.5\n')
    config = load_config(path, env={})
    assert (config.aging, config.clock_offset, config.stop_grace) == (120.0, -86400.0, 1.5)


def test_a_relative_socket_and_state_dir_are_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    flags = load_config(None, env={}, socket=Path("s.sock"), state_dir=Path("state"))
    assert (flags.socket, flags.state_dir) == (tmp_path / "s.sock", tmp_path / "state")
    env = load_config(None, env={"SESSIOND_SOCKET": "run/../s.sock", "SESSIOND_STATE_DIR": "st"})
    assert (env.socket, env.state_dir) == (tmp_path / "s.sock", tmp_path / "st")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    linked = load_config(None, env={}, socket=Path("link/s.sock"))
    assert linked.socket == tmp_path / "link" / "s.sock"  # as written, not resolved
    assert os.path.isabs(load_config(None, env={}).socket)


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


def test_run_user_is_refused_when_the_daemon_is_not_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    message = refusal('[run]\nuser = "nobody"\n', tmp_path)
    assert "run.user: the daemon runs as uid 1000, not root" in message


def test_run_user_may_not_be_root_or_unknown_and_group_needs_a_user(tmp_path: Path) -> None:
    assert "may not run as root" in refusal('[run]\nuser = "root"\n', tmp_path)
    assert "no user 'no-such-user-x'" in refusal('[run]\nuser = "no-such-user-x"\n', tmp_path)
    assert "[run] group needs [run] user" in refusal('[run]\ngroup = "nogroup"\n', tmp_path)


def test_run_user_as_root_names_the_uid_and_gid_programs_run_as(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("[run] user is accepted only for a daemon running as root")
    path = tmp_path / "sessiond.toml"
    path.write_text('[run]\nuser = "nobody"\n')
    import pwd

    nobody = pwd.getpwnam("nobody")
    assert load_config(path, env={}).run.identity() == (nobody.pw_uid, nobody.pw_gid)
