"""The sandbox's plan and its settings, as logic (the real bubblewrap runs in
tests/e2e/test_sandbox.py)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

import sessiond
from sessiond.config import BadConfig, load_config
from sessiond.runs.sandbox import (
    Boundary,
    MountPlan,
    SandboxUnavailable,
    _writes,
    confine,
    runtime,
)
from sessiond.runs.uids import ACCESS, DEFAULT, DynamicUids, _has, open_to, reach
from sessiond.sandboxconfig import parse_uid_range, run_uids
from sessiond.table.spec import BadSpec, parse_spec


def config(tmp_path: Path, text: str = "") -> object:
    path = tmp_path / "sessiond.toml"
    path.write_text(text)
    return load_config(path, env={}, state_dir=tmp_path / "state", socket=tmp_path / "s" / "s.sock")


def test_the_daemons_run_table_refuses_bad_boundary_values(tmp_path: Path) -> None:
    for text, why in [
        ('[run]\nsandbox = "maybe"\n', "run.sandbox: Input should be 'on' or 'off'"),
        ('[run]\nnetwork = "gateway"\n', "reaches the model gateway, and nothing else"),
        ('[run]\nnetwork = "lan"\n', 'network is "host" (the default) or "none"'),
        ('[run]\ndynamic_uids = "0-10"\n', "write dynamic_uids as FIRST-LAST"),
        ('[run]\ndynamic_uids = "60000-70000"\n', "overlaps systemd's DynamicUser range"),
        ('[run]\nwritable = ["rel/path"]\n', "is not an absolute path"),
    ]:
        with pytest.raises(BadConfig, match=why.replace("(", r"\(").replace(")", r"\)")):
            config(tmp_path, text)
    assert parse_uid_range("458752-524287") == range(458752, 524288)


def test_a_spec_takes_the_boundary_keys_and_refuses_bad_ones(tmp_path: Path) -> None:
    spec = parse_spec(
        'name = "s"\n[run]\nexec = ["true"]\nnetwork = "none"\nwritable = ["/var/cache/x/"]\n',
        base=tmp_path,
    )
    assert spec.run is not None
    assert (spec.run.network, spec.run.writable, spec.run.sandbox) == (
        "none",
        ["/var/cache/x"],
        "on",
    )
    with pytest.raises(BadSpec, match="reaches the model gateway, and nothing else"):
        parse_spec('name = "s"\n[run]\nexec = ["true"]\nnetwork = "gateway"\n', base=tmp_path)


def test_run_uids_cover_the_dynamic_range_whether_or_not_runs_get_it_now(tmp_path: Path) -> None:
    """Fail closed: a process with a uid of the range is a run's (of this or an
    earlier configuration), even where this daemon gives no dynamic uids now."""
    uids = run_uids(config(tmp_path))  # type: ignore[arg-type]
    assert 458752 in uids
    assert 524287 in uids
    assert 524288 not in uids
    assert 0 not in uids
    off = run_uids(config(tmp_path, '[run]\nsandbox = "off"\n'))  # type: ignore[arg-type]
    assert 458752 in off


def test_confine_puts_the_mounts_in_order_and_drops_last() -> None:
    plan = MountPlan(
        bwrap="/usr/bin/bwrap",
        cwd="/w",
        network="none",
        mounts=(("--tmpfs", "", "/state"), ("--bind", "/w", "/w")),
        env=(("HOME", "/h"),),
        drop=("/usr/bin/setpriv", 458800, 458800),
        home="/h",
    )
    argv = confine(["prog", "a"], plan)
    assert argv[0] == "/usr/bin/bwrap"
    assert "--unshare-net" in argv
    assert argv.index("--tmpfs", argv.index("/tmp")) < argv.index("--bind")
    tail = argv[argv.index("--") + 1 :]
    assert tail[:4] == ["/usr/bin/setpriv", "--reuid=458800", "--regid=458800", "--clear-groups"]
    assert tail[-2:] == ["prog", "a"]


def test_declared_writes_open_their_path_or_nearest_existing_folder(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "api.md").write_text("x")
    ws = str(tmp_path)
    assert _writes(ws, ["docs/api.md", "docs/new.md", "out/*.csv", "gone/deep/file"]) == [
        f"{ws}/docs/api.md",
        f"{ws}/docs",
        ws,
        ws,
    ]


def test_a_session_keeps_its_uid_and_no_two_share_one(tmp_path: Path) -> None:
    uids = DynamicUids(tmp_path)
    span = range(458752, 458755)
    a = uids.uid_of("a", span, set())
    b = uids.uid_of("b", span, {a + 100})
    assert a != b
    assert DynamicUids(tmp_path).uid_of("a", span, set()) == a  # from the file
    c = uids.uid_of("c", span, set())
    assert len({a, b, c}) == 3
    with pytest.raises(OSError, match="every uid of \\[run\\] dynamic_uids"):
        uids.uid_of("d", span, set())


def test_a_spec_path_of_the_daemons_own_is_refused(tmp_path: Path) -> None:
    cfg = config(tmp_path, '[run]\nbwrap = "/bin/true"\n')
    spec = parse_spec(
        f'name = "s"\n[run]\nexec = ["true"]\nreadable = ["{tmp_path}/state/web"]\n',
        base=tmp_path,
    )
    boundary = Boundary(tmp_path / "state")
    with pytest.raises(SandboxUnavailable, match="which no run may see"):
        boundary.plan_sync(cfg, spec, "s", others=[], wake_file=None)  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() != 0, reason="ACLs for another uid: root")
def test_the_workspace_is_opened_to_the_uid_by_acl_and_stays_the_operators(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "f").write_text("x")
    (ws / "state").mkdir()
    open_to(ws, 458800, never={str(ws / "state")}, only_inside=set())
    assert _has(str(ws), 458800, ACCESS)
    assert _has(str(ws), 458800, DEFAULT)
    assert _has(str(ws / "sub" / "f"), 458800, ACCESS)
    assert not _has(str(ws / "state"), 458800, ACCESS)
    assert os.stat(ws / "sub" / "f").st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(ws / "sub" / "f").st_mode) & 0o060 == 0o060  # the mask


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid of its own: a root daemon")
def test_a_run_is_shown_the_sessiond_package_its_python_imports(tmp_path: Path) -> None:
    """An editable install (`make run`'s) keeps the package in the checkout, outside
    the venv: a run's sessionctl or SDK program failed with "No module named
    'sessiond'" when the checkout lay under /tmp (the run's /tmp is private)."""
    package = os.path.realpath(os.path.dirname(sessiond.__file__))
    assert package in runtime()
    cfg = config(tmp_path, '[run]\nbwrap = "/bin/true"\n')
    spec = parse_spec('name = "s"\n[run]\nexec = ["true"]\n', base=tmp_path / "ws")
    (tmp_path / "ws").mkdir()
    (tmp_path / "state").mkdir()
    boundary = Boundary(tmp_path / "state")
    plan = boundary.plan_sync(cfg, spec, "s", others=[], wake_file=None)  # type: ignore[arg-type]
    assert plan is not None
    assert plan.drop is not None
    assert ("--ro-bind-try", package, package) in plan.mounts


def _as(uid: int, *argv: str) -> int:
    done = subprocess.run(
        list(argv), user=uid, group=uid, extra_groups=[], capture_output=True, check=False
    )
    return done.returncode


@pytest.mark.skipif(os.geteuid() != 0, reason="another uid: root")
def test_the_python_under_a_closed_home_is_reachable_by_the_runs_uid(tmp_path: Path) -> None:
    """A checkout in a home folder closed to others (0700): the uid gets a search-only
    entry on the folders above it, as a workspace's do, and can read the package."""
    home = tmp_path / "home"
    package = home / "src" / "sessiond"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    os.chmod(tmp_path, 0o755)
    os.chmod(home, 0o700)
    init = str(package / "__init__.py")
    assert _as(458801, "test", "-r", init) != 0  # the bug: nothing let the uid through
    reach(package, 458801)
    assert _as(458801, "test", "-r", init) == 0
    assert _has(str(home), 458801, ACCESS)
    assert _as(458801, "ls", str(home)) != 0  # search only: the home stays unlisted
    os.chmod(home, 0o700)  # the owner closes the home again: the mask turns the entry off
    assert _as(458801, "test", "-r", init) != 0
    reach(package, 458801)  # the next run's plan gives it again
    assert _as(458801, "test", "-r", init) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid of its own: a root daemon")
def test_a_claude_code_run_is_shown_its_cli_where_tmp_would_hide_it(tmp_path: Path) -> None:
    """`make agents` installs the CLI in the checkout's tests/agents/node_modules: in
    a clone under /tmp (mktemp -d) the run's private /tmp hid it ("No such file or
    directory: 'claude'")."""
    modules = tmp_path / "agents" / "node_modules"
    package = modules / "@anthropic-ai" / "claude-code" / "bin"
    package.mkdir(parents=True)
    (package / "claude.exe").write_text("#!/bin/sh\n")
    (package / "claude.exe").chmod(0o755)
    (modules / ".bin").mkdir()
    (modules / ".bin" / "claude").symlink_to("../@anthropic-ai/claude-code/bin/claude.exe")
    (tmp_path / "ws").mkdir()
    (tmp_path / "state").mkdir()
    spec = parse_spec(
        'name = "cc"\n[run]\nkind = "claude-code"\n'
        f'[claude_code]\nprompt = "hi"\ncli = "{modules}/.bin/claude"\n',
        base=tmp_path / "ws",
    )
    cfg = config(tmp_path, '[run]\nbwrap = "/bin/true"\n')
    plan = Boundary(tmp_path / "state").plan_sync(cfg, spec, "cc", others=[], wake_file=None)  # type: ignore[arg-type]
    assert plan is not None
    for shown in (str(modules / ".bin"), str(modules)):
        assert ("--ro-bind-try", shown, shown) in plan.mounts


def test_a_file_the_command_names_in_a_writable_folder_stays_writable(tmp_path: Path) -> None:
    """A named file under /tmp is shown to the run read-only, unless a writable bind
    shows it already: a read-only bind on top of it would take the write back."""
    world, other, ws = tmp_path / "world", tmp_path / "other", tmp_path / "ws"
    for folder in (world, other, ws, tmp_path / "state"):
        folder.mkdir()
    (world / "ledger").touch()
    (other / "input").touch()
    cfg = config(tmp_path, f'[run]\nbwrap = "/bin/true"\nwritable = ["{world}"]\n')
    spec = parse_spec(
        f'name = "s"\n[run]\nexec = ["sh", "-c", "x", "{world}/ledger", "{other}/input"]\n'
        f'cwd = "{ws}"\n',
        base=ws,
    )
    plan = Boundary(tmp_path / "state").plan_sync(
        cfg,  # type: ignore[arg-type]
        spec,
        "s",
        others=[],
        wake_file=None,
    )
    assert plan is not None
    assert ("--bind-try", str(world), str(world)) in plan.mounts
    ledger = str(world / "ledger")
    assert not [m for m in plan.mounts if m[0].startswith("--ro-bind") and m[2] == ledger]
    assert ("--ro-bind-try", str(other / "input"), str(other / "input")) in plan.mounts
