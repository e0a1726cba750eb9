"""A hostile program against what the daemon does as root on paths its run
controls (programs/boundary_attacker.py), through the real daemon, real
bubblewrap and a uid of the run's own (tests run as root, as CI does).

- The daemon's ``git`` in a workspace: the run writes the repository's
  ``.git/config``, so a ``git`` the daemon starts there must read none of it
  (a partial clone's promisor remote would run the run's own script as root).
- A program's ``create``: the new session may reach no more of the host than
  its creator (no ``writable`` or workspace beyond the creator's own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Daemon, running, short_dir, wait_event, wait_for

PROGRAM = Path(__file__).parent / "programs" / "boundary_attacker.py"
PYTHON = "/usr/bin/python3"
ROOT = os.geteuid() == 0

pytestmark = pytest.mark.skipif(not ROOT, reason="the run's own uid needs a root daemon")


@pytest.fixture
def ledger() -> Iterator[Path]:
    folder = short_dir()
    os.chmod(folder, 0o777)  # the run's uid writes here too
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def program() -> Iterator[Path]:
    """The attacker where any uid can read it (pytest's checkout may be closed)."""
    folder = short_dir()
    os.chmod(folder, 0o755)
    copy = folder / PROGRAM.name
    shutil.copyfile(PROGRAM, copy)
    os.chmod(copy, 0o644)
    try:
        yield copy
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def attacker(
    d: Daemon,
    name: str,
    ws: Path,
    program: Path,
    ledger: Path,
    mode: str,
    extra: str = "",
    env: str = "",
    retries: int = 0,
) -> dict[str, Any]:
    spec = (
        f'name = "{name}"\ngoal = "attack"\n[run]\nkind = "sdk"\n'
        f'exec = ["{PYTHON}", "-I", "{program}"]\ncwd = "{ws}"\nretries = {retries}\n'
        f'env = {{ ATTACK_MODE = "{mode}", ATTACK_LEDGER = "{ledger}"'
        f"{', ' + env if env else ''} }}\n"
        f"{extra}"
    )
    d.ctl("create", str(d.write_spec(name, spec)), check=True)
    d.ctl("activate", name, check=True)
    return wait_event(d, name, "run.finished")


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def test_the_daemons_git_runs_nothing_a_run_wrote_in_the_repository(
    ledger: Path, program: Path
) -> None:
    ws = short_dir()
    try:
        git = ["git", "-C", str(ws), "-c", "user.name=op", "-c", "user.email=op@example.org"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True)
        with running() as d:
            attacker(d, "prog", ws, program, ledger, "git")
            results = read(ws / "program.json")
            assert results["step"]["ok"], results  # the daemon read HEAD for the step
        pwned = ledger / "pwned"
        assert not pwned.exists(), f"the run's script ran as uid {pwned.read_text().strip()}"
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def test_a_git_the_daemon_starts_in_a_crafted_repository_runs_nothing(tmp_path: Path) -> None:
    """The git trigger's path (sessiond.gitrefs.git, real git): a repository whose
    config names a promisor remote and commands of its own, as a run could leave
    its workspace; the daemon's git fetches nothing and runs none of them."""
    from sessiond.gitrefs import git, resolve

    repo, marker = tmp_path / "repo", tmp_path / "ran"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    script.chmod(0o755)
    (repo / ".git" / "config").write_text(
        "[core]\n\trepositoryformatversion = 1\n\tfsmonitor = " + str(script) + "\n"
        "[extensions]\n\tpartialClone = origin\n"
        "[protocol]\n\tallow = always\n"
        '[protocol "file"]\n\tallow = always\n'
        f'[remote "origin"]\n\turl = {tmp_path}\n\tpromisor = true\n\tuploadpack = {script}\n'
        "[log]\n\tshowSignature = true\n"
        f"[gpg]\n\tprogram = {script}\n"
    )
    (repo / ".git" / "refs" / "heads" / "main").write_text("1" * 40 + "\n")
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/other\n")
    (repo / ".git" / "refs" / "heads" / "other").write_text("ref: refs/heads/main\n")
    assert resolve(repo, "HEAD", ask_git=False) == "1" * 40  # followed, from the files
    assert git(repo, "rev-parse", "--verify", "-q", "1" * 40 + "^{commit}") is None
    assert git(repo, "show", "--name-only", "1" * 40) is None
    git(repo, "status")  # the index is read: fsmonitor would run here
    assert not marker.exists(), "the repository's command ran as the daemon"


@pytest.mark.parametrize("how", ["writable", "cwd"])
def test_a_session_a_program_creates_reaches_no_more_than_its_own(
    ledger: Path, program: Path, how: str
) -> None:
    """Grant ``create``: the new session's ``[run]`` names a folder outside the
    creator's workspace (to write, or as its workspace). It is refused, naming
    it; had it run, the daemon would have opened that folder to its uid."""
    ws, target = short_dir(), short_dir()
    os.chmod(target, 0o755)  # the operator's, as /etc is
    try:
        with running() as d:
            env = f'ATTACK_TARGET = "{target}", ATTACK_HOW = "{how}"'
            extra = 'grants = ["create", "log", "ps", "send", "show"]\n'
            attacker(d, "prog", ws, program, ledger, "create", extra, env)
            created = read(ws / "program.json")["create"]
            if created.get("ok"):  # the old daemon: the child runs, as an operator would start it
                d.ctl("activate", "child", check=True)
                wait_event(d, "child", "run.finished")
            else:
                assert "writ" in created["error"]["message"], created  # writable, may write
                assert str(target) in created["error"]["message"], created
        assert not (target / "owned.txt").exists(), "the child wrote outside its creator's reach"
        assert not os.listxattr(target), "the daemon opened the folder to the child's uid"
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)


def test_a_step_cannot_make_the_daemon_open_a_fifo_or_a_file_outside(
    ledger: Path, program: Path
) -> None:
    """``writes`` of a step names a FIFO (the daemon's open would wait for a writer,
    its loop with it), a symlink to a root-only file and its absolute path: the
    step is refused (or the paths left unread) and the daemon keeps answering."""
    ws, secret = short_dir(), ledger / "secret"
    secret.write_text("the operator's secret\n")
    os.chmod(secret, 0o600)
    try:
        with running() as d:
            env = f'ATTACK_TARGET = "{secret}"'
            spec = (
                f'name = "prog"\ngoal = "attack"\n[run]\nkind = "sdk"\n'
                f'exec = ["{PYTHON}", "-I", "{program}"]\ncwd = "{ws}"\nretries = 0\n'
                f'env = {{ ATTACK_MODE = "writes", ATTACK_LEDGER = "{ledger}", {env} }}\n'
            )
            d.ctl("create", str(d.write_spec("prog", spec)), check=True)
            d.ctl("activate", "prog", check=True)
            answer = None
            try:
                wait_event(d, "prog", "run.finished", timeout=15)
                answer = d.ctl("ps", timeout=10)
            finally:
                if answer is None:  # the old daemon waits in open(): let it go
                    _release(ws / "pipe")
            assert answer.returncode == 0, answer.stderr
            results = read(ws / "program.json")
            assert results["step"]["result"]["status"] == "run", results
            outside = json.dumps(results["outside"])
            assert "not a path inside the workspace" in outside, results
            started = d.json("log", "prog", "--type", "tool.started")
            assert [e["data"]["hashes"] for e in started] == [{"pipe": None, "link": None}]
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def _release(fifo: Path) -> None:
    """A daemon waiting in open() of the FIFO (the old code) gets its writer, and
    then its end of file."""
    for _ in range(50):  # (the old code opens it more than once: for the hash, for the diff)
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: no one waits on it, gone: nothing left to release
            return


def test_symlinks_at_declared_paths_lead_nowhere(ledger: Path, program: Path) -> None:
    """A run makes the paths its spec declares symlinks out of its workspace: a
    ``writes`` folder to another session's workspace, a ``writable`` folder in
    its workspace to a folder of the operator's. Its next run neither reads the
    other workspace nor writes that folder, and the daemon opened neither to it."""
    # (out of /tmp, which is the run's own: as /etc and /srv are)
    ws, other, above = (Path(tempfile.mkdtemp(prefix="sd-", dir="/var/tmp")) for _ in range(3))
    target = above / "cache"
    target.mkdir()
    (ws / "a" / "cache").mkdir(parents=True)
    os.chmod(other, 0o755)
    (other / "secret.txt").write_text("the other session's work\n")
    os.chmod(other / "secret.txt", 0o644)
    os.chmod(target, 0o755)
    os.chmod(above, 0o755)
    try:
        with running() as d:
            d.ctl(
                "create",
                str(
                    d.write_spec(
                        "other", f'name = "other"\n[run]\nexec = ["true"]\ncwd = "{other}"\n'
                    )
                ),
                check=True,
            )
            env = f'ATTACK_OTHER = "{other}", ATTACK_TARGET = "{target}"'
            extra = f'writes = ["out/x.txt"]\nwritable = ["{ws}/a/cache"]\n'
            first = attacker(d, "prog", ws, program, ledger, "symlink", extra, env, retries=1)
            assert read(ws / "program.json").get("first"), read(ws / "program.json")
            # the retry: a run that starts (or is refused) after the first
            wait_event(d, "prog", "run.finished", since=first["seq"] + 1)
            shown = json.dumps(d.json("log", "prog"))
            results = read(ws / "program.json") if not (ws / "program.json").is_symlink() else {}
        assert "read" not in results, results
        assert not (target / "owned.txt").exists(), results
        assert not os.listxattr(target), "the daemon opened the operator's folder to the run"
        assert "through a symlink" in shown, shown
    finally:
        for folder in (ws, other, above):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("how", ["file", "env", "fifo"])
def test_a_session_a_program_creates_gets_no_secret_its_creator_has_not(
    ledger: Path, program: Path, how: str
) -> None:
    """Grant ``create``: the new session's ``[run] secrets`` name a file of the
    daemon's state, a variable of the daemon's environment, or a FIFO (the daemon's open
    would wait on it, and its loop with it). Refused, naming the secret; the daemon
    keeps answering; no value reaches the workspace."""
    ws = short_dir()
    mark = "daemon-only-value-7f3a"
    try:
        with running(env={"SESSIOND_TEST_MARK": mark}) as d:
            target = {"file": str(d.state_dir / "uids.json"), "env": "SESSIOND_TEST_MARK"}
            env = f'ATTACK_TARGET = "{target.get(how, "")}", ATTACK_HOW = "{how}"'
            extra = 'grants = ["create", "log", "ps", "send", "show"]\n'
            answer = None
            try:
                attacker(d, "prog", ws, program, ledger, "secrets", extra, env)
                answer = d.ctl("ps", timeout=10)
            finally:
                if answer is None:
                    _release(ws / "pipe")
            assert answer.returncode == 0, answer.stderr
            created = read(ws / "program.json")["create"]
            if created.get("ok"):  # the old daemon: the child runs, as an operator would start it
                d.ctl("activate", "child", check=True)
                wait_event(d, "child", "run.finished")
            else:
                assert "secret" in created["error"]["message"], created
        stolen = ws / "stolen.txt"
        assert not stolen.exists() or not stolen.read_text(), stolen.read_text()
        assert not list(ws.glob("stolen*"))
    finally:
        shutil.rmtree(ws, ignore_errors=True)


@pytest.mark.parametrize("how", ["fifo", "zero"])
def test_a_workspace_git_head_that_never_ends_stalls_nothing(
    ledger: Path, program: Path, how: str
) -> None:
    """The run makes its workspace's ``.git/HEAD`` a FIFO, or its branch's ref a
    symlink to ``/dev/zero``: the daemon reads HEAD for the step's record without
    waiting or reading past a ref's size, and keeps answering."""
    ws = short_dir()
    try:
        with running() as d:
            answer = None
            try:
                attacker(d, "prog", ws, program, ledger, "githead", "", f'ATTACK_HOW = "{how}"')
                answer = d.ctl("ps", timeout=10)
            finally:
                if answer is None:
                    _release(ws / ".git" / "HEAD")
            assert answer.returncode == 0, answer.stderr
            assert read(ws / "program.json")["step"]["result"]["status"] == "run"
            started = d.json("log", "prog", "--type", "tool.started")
            assert [e["data"].get("git_head") for e in started] == [None], started
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def test_one_run_cannot_take_every_connection_of_the_program_endpoint(
    ledger: Path, program: Path
) -> None:
    """A run holds idle connections to the program endpoint, as many as the
    daemon takes: another session's program still gets its step answered."""
    ws, other = short_dir(), short_dir()
    try:
        with running("max_connections = 300\n") as d:
            d.ctl(
                "create",
                str(
                    d.write_spec(
                        "flood",
                        f'name = "flood"\n[run]\nkind = "sdk"\nexec = ["{PYTHON}", "-I", '
                        f'"{program}"]\ncwd = "{ws}"\nretries = 0\nenv = {{ ATTACK_MODE = '
                        f'"flood", ATTACK_LEDGER = "{ledger}", ATTACK_COUNT = "400" }}\n',
                    )
                ),
                check=True,
            )
            d.ctl("activate", "flood", check=True)
            holding = wait_for((ws / "holding.json").exists, what="the flood")
            assert holding
            try:
                attacker(d, "victim", other, program, ledger, "step")
                result = read(other / "program.json")
            finally:
                (ws / "stop").write_text("")
            assert result["step"].get("ok"), result
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


def test_a_session_a_program_creates_stands_no_higher_and_spends_no_more(
    ledger: Path, program: Path
) -> None:
    """Grant ``create``: the new session asks priority 100, another agent's name and
    no budget, to go first at the model and spend outside its creator's budget.
    Refused, naming each; no such session exists."""
    ws = short_dir()
    try:
        with running() as d:
            spec = (
                f'name = "prog"\ngoal = "attack"\nagent = "scribe"\npriority = 10\n'
                f'[run]\nkind = "sdk"\nexec = ["{PYTHON}", "-I", "{program}"]\ncwd = "{ws}"\n'
                f'retries = 0\ngrants = ["create", "log", "ps", "send", "show"]\n'
                f'env = {{ ATTACK_MODE = "standing", ATTACK_LEDGER = "{ledger}" }}\n'
                "[budget]\ntokens_per_day = 1000\n"
            )
            d.ctl("create", str(d.write_spec("prog", spec)), check=True)
            d.ctl("activate", "prog", check=True)
            wait_event(d, "prog", "run.finished")
            created = read(ws / "program.json")["create"]
            assert not created.get("ok"), created
            message = created["error"]["message"]
            assert "priority 100 is above this session's 10" in message, message
            assert "runs as agent 'someone-else'" in message, message
            assert "tokens_per_day is unlimited" in message, message
            assert [s["name"] for s in d.json("ps", "--all")] == ["prog"]
    finally:
        shutil.rmtree(ws, ignore_errors=True)
