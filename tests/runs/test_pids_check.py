"""``[run] max_processes``: the spec key, and the check that refuses it where the
daemon has no pids controller (pure logic; the real cgroups are in test_cgroups.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.config import BadConfig, load_config
from sessiond.runs.cgroups import CgroupSupport, pids_refusal
from sessiond.syscalls.control import check_environment
from sessiond.table.spec import BadSpec, parse_spec, spec_to_toml

FIX = "configure [run] pids_cgroup or run under systemd with Delegate=yes"


def spec(extra: str = "") -> str:
    return f'name = "bounded"\n[run]\nexec = ["true"]\n{extra}'


def test_max_processes_is_a_positive_whole_number_kept_in_the_stored_spec(
    tmp_path: Path,
) -> None:
    parsed = parse_spec(spec("max_processes = 16\n"), base=tmp_path)
    assert parsed.run is not None
    assert parsed.run.max_processes == 16
    assert "max_processes = 16" in spec_to_toml(parsed)
    again = parse_spec(spec_to_toml(parsed), base=tmp_path)
    assert again.run is not None
    assert again.run.max_processes == 16
    unset = parse_spec(spec(), base=tmp_path)
    assert unset.run is not None
    assert unset.run.max_processes is None
    for bad in ("0", "-3", '"many"', "2.5", "4194305"):
        with pytest.raises(BadSpec, match=r"run\.max_processes"):
            parse_spec(spec(f"max_processes = {bad}\n"), base=tmp_path)


def test_the_check_refuses_max_processes_with_the_reason_and_what_to_do(tmp_path: Path) -> None:
    bounded = parse_spec(spec("max_processes = 4\n"), base=tmp_path)
    reason = pids_refusal(None, '[run] cgroup is "off", and no [run] pids_cgroup is set')
    assert reason is not None
    with pytest.raises(BadSpec) as refused:
        check_environment(bounded, pids_refusal=reason)
    message = str(refused.value)
    assert message.startswith("bounded: run.max_processes: max_processes needs a pids controller")
    assert '[run] cgroup is "off"' in message
    assert message.endswith(FIX)
    assert refused.value.exit_code == 5
    check_environment(bounded, pids_refusal=None)  # a daemon with pids takes it
    unbounded = parse_spec(spec(), base=tmp_path)
    check_environment(unbounded, pids_refusal=reason)  # no limit asked: nothing to refuse


def test_pids_refusal_says_why_a_cgroup_without_pids_cannot_bound(tmp_path: Path) -> None:
    folder = Path("/sys/fs/cgroup/x")
    without = CgroupSupport(folder, None, None, True, "the cgroup2 folder has no pids")
    refusal = pids_refusal(without, "")
    why = "the cgroup2 folder has no pids"
    assert refusal == f"max_processes needs a pids controller: {why}; {FIX}"
    assert pids_refusal(CgroupSupport(folder, None, "cgroup2", True), "") is None
    assert pids_refusal(CgroupSupport(None, folder, "v1", False), "") is None


def test_the_daemon_config_refuses_cgroup_paths_that_are_not_absolute(tmp_path: Path) -> None:
    conf = tmp_path / "sessiond.toml"
    conf.write_text('[run]\ncgroup = "sessiond"\n')
    with pytest.raises(BadConfig, match=r'run\.cgroup: .*use "auto", "off" or an absolute path'):
        load_config(conf, env={})
    conf.write_text('[run]\npids_cgroup = "pids/sessiond"\n')
    with pytest.raises(BadConfig, match=r"run\.pids_cgroup: .*absolute path"):
        load_config(conf, env={})
    conf.write_text(
        '[run]\ncgroup = "/sys/fs/cgroup/sessiond"\npids_cgroup = "/sys/fs/cgroup/pids/s"\n'
    )
    loaded = load_config(conf, env={})
    assert loaded.run.cgroup == "/sys/fs/cgroup/sessiond"
    assert loaded.run.pids_cgroup == Path("/sys/fs/cgroup/pids/s")
    assert load_config(None, env={}).run.cgroup == "auto"
