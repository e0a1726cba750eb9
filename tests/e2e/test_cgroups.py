"""``[run] max_processes`` through the real daemon: refused at create and reload
where the daemon has no pids controller, taken where it has one."""

from __future__ import annotations

import pytest

from tests.e2e.harness import running
from tests.runs import cgroup_env

BOUNDED = 'name = "bounded"\n[run]\nexec = ["true"]\nmax_processes = 16\n'
FIX = "configure [run] pids_cgroup or run under systemd with Delegate=yes"


def test_create_refuses_max_processes_without_a_pids_controller() -> None:
    with running('[run]\ncgroup = "off"\n') as d:
        done = d.ctl("create", str(d.write_spec("bounded", BOUNDED)))
        assert done.returncode == 5, done.stderr
        assert "run.max_processes: max_processes needs a pids controller" in done.stderr
        assert '[run] cgroup is "off", and no [run] pids_cgroup is set' in done.stderr
        assert FIX in done.stderr
        assert d.json("ps") == []
        # the same spec without the bound is fine
        d.ctl("create", str(d.write_spec("free", BOUNDED.replace("max_processes = 16\n", ""))),
              check=True)  # fmt: skip


def test_reload_refuses_a_new_spec_with_max_processes_without_a_pids_controller() -> None:
    with running('specs = "specs"\n[run]\ncgroup = "off"\n') as d:
        (d.root / "specs").mkdir()
        (d.root / "specs" / "bounded.toml").write_text(BOUNDED)
        done = d.ctl("reload")
        assert done.returncode == 1
        assert "max_processes needs a pids controller" in done.stdout
        assert d.json("ps") == []


def test_create_names_a_configured_cgroup_folder_that_is_missing() -> None:
    with running('[run]\ncgroup = "/sys/fs/cgroup/sessiond-no-such-folder"\n') as d:
        done = d.ctl("create", str(d.write_spec("bounded", BOUNDED)))
        assert done.returncode == 5
        assert "[run] cgroup: /sys/fs/cgroup/sessiond-no-such-folder is not a folder" in done.stderr


@pytest.mark.parametrize("layout", cgroup_env.layouts(bounding=True))
def test_create_takes_max_processes_where_the_daemon_has_a_pids_controller(layout: str) -> None:
    for folders in cgroup_env.make_folders():
        run = folders.config(layout).run
        config = f'[run]\ncgroup = "{run.cgroup}"\n'
        if run.pids_cgroup is not None:
            config += f'pids_cgroup = "{run.pids_cgroup}"\n'
        with running(config) as d:
            d.ctl("create", str(d.write_spec("bounded", BOUNDED)), check=True)
            stored = (d.state_dir / "sessions" / "bounded" / "spec.toml").read_text()
            assert "max_processes = 16" in stored
