"""A ``[compact] exec`` command runs like the session's program, never as the
daemon: through the spawner, in a holder and cgroup of its own, as ``[run]
user``, with the run mark; bounded in time and output; everything it started
stops with it; and the session's lock is not held while it runs.

Real daemon, real sessionctl, real commands (tests/e2e/programs/compactor.py),
which write what they did to a ledger outside the daemon. The sandbox is on (the
default): a compaction command is confined like a run, with a private /tmp and
the daemon's state hidden, so the ledger is a folder the daemon's ``[run]
writable`` opens to every run, and the programs are copies any uid can read, in
a folder its ``[run] readable`` shows (a session's dynamic uid cannot read a
checkout closed to others, and the private /tmp hides the copies otherwise).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.harness import (
    SESSIONCTL,
    Daemon,
    alive,
    readable_by_others,
    running,
    short_dir,
    wait_event,
    wait_for,
)

PROGRAMS = Path(__file__).parent / "programs"
PYTHON = "/usr/bin/python3"
# The layer beneath the sandbox: the control socket's own refusal of a run's
# processes (a compaction command carries the run mark). With the sandbox on the
# command cannot even reach the control socket, so these checks turn it off, as
# an operator may.
UNCONFINED = 'sandbox = "off"\n'

ATTACKER_SPEC = """name = "prog"
goal = "pay the bill"
[run]
kind = "sdk"
exec = ["{python}", "-I", "{program}"]
cwd = "{ws}"
retries = 0
grants = ["create", "send", "compact"]
env = {{ ATTACK_MODE = "{mode}", ATTACK_LEDGER = "{ledger}", ATTACK_COMPACTOR = "{compactor}", \
ATTACK_CONTROL = "{control}", ATTACK_CTL = "{ctl}" }}
[compact]
exec = ["{python}", "-I", "{ws}/summarise.py"]
[policy]
ask = ["pay"]
"""

SUMMARISE = 'import sys\nsys.stdin.read()\nprint("a fair summary")\n'


@pytest.fixture
def ledger() -> Iterator[Path]:
    folder = short_dir()
    os.chmod(folder, 0o777)  # the [run] user writes here too
    try:
        yield folder
    finally:
        for pid in left_of(folder):  # what a failing test left running: not left behind
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def programs() -> Iterator[Path]:
    """The folder of copies of compactor.py and compact_attacker.py any uid can read."""
    with readable_by_others(PROGRAMS / "compactor.py", PROGRAMS / "compact_attacker.py") as (
        compactor,
        _,
    ):
        yield compactor.parent


def config(ledger: Path, programs: Path, extra: str = "") -> str:
    """The daemon's configuration: every run (and compaction command) may write the
    ledger and read the programs; ``extra`` goes on in the ``[run]`` table."""
    return f'[run]\nwritable = ["{ledger}"]\nreadable = ["{programs}"]\n{extra}'


def compactor(programs: Path, ledger: Path, action: str, *args: str) -> list[str]:
    return [PYTHON, "-I", str(programs / "compactor.py"), str(ledger), action, *args]


def left_of(ledger: Path) -> list[int]:
    """The host's pids of the processes a command started (each names the ledger on
    its command line, as its sandbox's bubblewrap does): inside its own pid
    namespace, the pids a command sees are not the host's."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # gone meanwhile
            if os.fsencode(ledger) in argv and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def read(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def compacting(d: Daemon, name: str, argv: list[str], extra: str = "") -> None:
    """A session with no program whose ``[compact] exec`` is ``argv``, and two messages."""
    spec = f'name = "{name}"\ngoal = "notes"\n[compact]\nexec = {orjson.dumps(argv).decode()}\n'
    d.ctl("create", str(d.write_spec(name, spec + extra)), check=True)
    for text in ("first note. more", "second note"):
        d.ctl("send", name, text, check=True)


def attack(d: Daemon, ledger: Path, programs: Path, mode: str) -> Path:
    ws = short_dir()
    (ws / "summarise.py").write_text(SUMMARISE)
    spec = ATTACKER_SPEC.format(
        python=PYTHON,
        program=programs / "compact_attacker.py",
        ws=ws,
        mode=mode,
        ledger=ledger,
        compactor=programs / "compactor.py",
        control=d.socket,
        ctl=SESSIONCTL,
    )
    d.ctl("create", str(d.write_spec("prog", spec)), check=True)
    for text in ("the bill is due", "pay it today"):
        d.ctl("send", "prog", text, check=True)
    d.ctl("activate", "prog", check=True)
    wait_event(d, "prog", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked")
    return ws


def check_not_approved(d: Daemon, ledger: Path, *, sandboxed: bool) -> None:
    """The command's approve was refused (confined: it cannot reach the control
    socket at all; unconfined: as a run's process), and ``pay`` is still pending."""
    answer = read(ledger / "approve.json")
    approve = answer["approve"]
    assert approve["code"] != 0, answer
    why = "the daemon is not reachable" if sandboxed else "only ping"
    assert why in approve["stderr"], answer
    assert answer["env_socket"] is None  # the daemon's control socket is not handed down
    shown = d.json("show", "prog")
    assert [a["tool"] for a in shown["pending_approvals"]] == ["pay"], shown
    assert not d.json("log", "prog", "--type", "approval.granted")
    assert not (ledger / "paid.json").exists()


@pytest.mark.parametrize("sandbox", ["on", "off"])
def test_a_command_of_a_session_a_program_created_cannot_approve_its_call(
    ledger: Path, programs: Path, sandbox: str
) -> None:
    """(a) grants create and compact: the new session's compaction command runs the
    real sessionctl approve for the program's pending call; it is refused."""
    with running(config(ledger, programs, "" if sandbox == "on" else UNCONFINED)) as d:
        ws = attack(d, ledger, programs, "create")
        try:
            results = read(ledger / "program.json")
            assert results["asked"]["result"]["status"] == "ask", results
            assert results["create"]["ok"], results  # its program has a [run]: allowed
            assert results["compact"]["ok"], results  # compacted, with a summary
            check_not_approved(d, ledger, sandboxed=sandbox == "on")
            (compacted,) = d.json("log", "helper", "--type", "context.compacted")
            assert compacted["data"]["method"] == "command"
            assert compacted["data"]["summary"] == "summary by approve: 2 items"
        finally:
            shutil.rmtree(ws, ignore_errors=True)


@pytest.mark.parametrize("who", ["a person", "the program"])
def test_a_rewritten_summarise_py_cannot_approve(ledger: Path, programs: Path, who: str) -> None:
    """(b) the program rewrites the summarise.py its own [compact] exec names;
    then a person (sessionctl compact) or the program (grant compact) compacts."""
    mode = "rewrite" if who == "a person" else "rewrite-compact"
    with running(config(ledger, programs)) as d:
        ws = attack(d, ledger, programs, mode)
        try:
            results = read(ledger / "program.json")
            assert results["asked"]["result"]["status"] == "ask", results
            if who == "a person":
                d.ctl("compact", "prog", "--keep", "0", check=True)
            else:
                assert results["compact"]["ok"], results
            check_not_approved(d, ledger, sandboxed=True)
            (compacted,) = d.json("log", "prog", "--type", "context.compacted")
            assert compacted["data"]["summary"].startswith("summary by approve")
            # the operator's own approval still works, and the gated step then runs
            d.ctl("approve", "prog", check=True)
            wait_for((ledger / "paid.json").exists, what="the approved step")
        finally:
            shutil.rmtree(ws, ignore_errors=True)


def test_a_compaction_command_runs_as_the_run_user_not_root(ledger: Path, programs: Path) -> None:
    """(c) under [run] user = "nobody" the command runs as nobody, never uid 0."""
    if os.geteuid() != 0:
        pytest.skip("[run] user needs a daemon running as root (the tests run as root in CI)")
    with running(config(ledger, programs, 'user = "nobody"\n')) as d:
        compacting(d, "n", compactor(programs, ledger, "uid"))
        d.ctl("compact", "n", "--keep", "0", check=True)
        ran = read(ledger / "uid.json")
        assert ran["uid"] == pwd.getpwnam("nobody").pw_uid != 0, ran
        assert ran["items"] == 2


def test_a_compaction_command_cannot_read_the_state_dir(ledger: Path, programs: Path) -> None:
    """A compaction command is confined like a run: the daemon's state (the logs,
    the console's keys) is hidden from it, whoever the session is."""
    with running(config(ledger, programs)) as d:
        secret = d.state_dir / "secret"
        secret.write_text("the daemon's own")
        compacting(d, "n", compactor(programs, ledger, "peek", str(d.state_dir)))
        before = [_acl(p) for p in (d.root, d.state_dir)]
        d.ctl("compact", "n", "--keep", "0", check=True)
        # nor are the daemon's folders opened to its uid (its private folder, the
        # session's home, lies in the state dir: it is the uid's own, not shared)
        assert [_acl(p) for p in (d.root, d.state_dir)] == before
        peeked = read(ledger / "peek.json")
        assert peeked["items"] == 2  # it ran, with its items
        # nothing of the daemon's (at most the way to the command's own private folder)
        assert "secret" not in peeked["listing"], peeked
        assert peeked["secret"].startswith("error: "), peeked
        assert "secret" in os.listdir(d.state_dir)  # (it is there, outside)
        assert peeked["uid"] != 0 or os.geteuid() != 0, peeked  # a root daemon drops it


def _acl(path: Path) -> bytes | None:
    """The folder's POSIX ACL, as stored (None: it has none, its mode alone)."""
    try:
        return os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return None


def test_what_a_compaction_command_started_is_gone_when_it_ends(
    ledger: Path, programs: Path
) -> None:
    """(d) a double-forked setsid child holding no pipe of the command."""
    with running(config(ledger, programs)) as d:
        compacting(d, "n", compactor(programs, ledger, "leave"))
        d.ctl("compact", "n", "--keep", "0", check=True)
        assert read(ledger / "left.json")  # the child ran
        # the RPC answered after the holder had killed and reaped its subtree
        assert not left_of(ledger), "the compaction command's child is still running"


def test_a_child_holding_stdout_does_not_fail_the_compaction(ledger: Path, programs: Path) -> None:
    """(e) the command exits while its child keeps stdout open: the answer is the
    summary (never "internal error ... exit 70"), and the child is gone."""
    with running(config(ledger, programs)) as d:
        compacting(d, "n", compactor(programs, ledger, "hold-stdout"))
        done = d.ctl("compact", "n", "--keep", "0", timeout=40)
        assert done.returncode == 0, done.stderr
        (compacted,) = d.json("log", "n", "--type", "context.compacted")
        assert compacted["data"]["summary"] == "summary by hold-stdout: 2 items"
        assert read(ledger / "hold-stdout.json")  # it started its child
        assert not left_of(ledger), "the child holding stdout is still running"


def test_a_waiting_compaction_command_does_not_stall_an_approve(
    ledger: Path, programs: Path
) -> None:
    """(f) while the session's compaction command waits (after trying to call back
    into the daemon), a person approves that session's pending call at once."""
    release = ledger / "release"
    with running(config(ledger, programs)) as d:
        argv = compactor(programs, ledger, "wait", str(d.socket), SESSIONCTL, str(release))
        run = '[run]\nexec = ["true"]\nretries = 0\n[policy]\nask = ["command"]\n'
        compacting(d, "n", argv, run)
        d.ctl("activate", "n", check=True)
        wait_event(d, "n", "approval.requested")
        compact = subprocess.Popen(
            [SESSIONCTL, "compact", "n", "--keep", "0"],
            env=d.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            (waiting,) = wait_for(lambda: list(ledger.glob("waiting-*.json")), what="it")
            # the command still waits (nothing released it): the approve must not
            approved = d.ctl("approve", "n", timeout=20)
            assert approved.returncode == 0, approved.stderr
            assert compact.poll() is None  # the compaction really was under way
            callback = read(waiting)["callback"]
            # confined as a run: the control socket is not there for it
            assert "the daemon is not reachable" in callback["stderr"], callback
            release.touch()
            _, err = compact.communicate(timeout=30)
            assert compact.returncode == 0, err
        finally:
            if compact.poll() is None:
                compact.kill()
                compact.communicate()
        wait_event(d, "n", "run.finished")  # the approved command ran
        (compacted,) = d.json("log", "n", "--type", "context.compacted")
        assert compacted["data"]["summary"].startswith("summary by wait")


def test_a_command_past_its_timeout_is_stopped_and_refused(ledger: Path, programs: Path) -> None:
    """(g) a command past its [compact] timeout is stopped with what it started, and
    refused saying so; nothing is recorded."""
    with running(config(ledger, programs)) as d:
        compacting(d, "slow", compactor(programs, ledger, "hang"), 'timeout = "1s"\n')
        done = d.ctl("compact", "slow", "--keep", "0", timeout=40)
        assert done.returncode == 1, done
        assert "took more than 1s ([compact] timeout)" in done.stderr, done.stderr
        assert "stopped with everything it started" in done.stderr
        assert read(ledger / "hanging.json")  # it ran
        assert not left_of(ledger), "the command past its timeout is still running"
        assert not d.json("log", "slow", "--type", "context.compacted")


def test_a_command_that_prints_past_the_bound_is_stopped_and_refused(
    ledger: Path, programs: Path
) -> None:
    """(g) more than the output bound on stdout: stopped, refused, nothing recorded."""
    with running(config(ledger, programs)) as d:
        compacting(d, "loud", compactor(programs, ledger, "flood"))
        done = d.ctl("compact", "loud", "--keep", "0", timeout=40)
        assert done.returncode == 1, done
        assert "printed more than 65536 bytes" in done.stderr, done.stderr
        assert not d.json("log", "loud", "--type", "context.compacted")


def test_of_two_compactions_at_once_only_the_first_to_finish_is_recorded(
    ledger: Path, programs: Path
) -> None:
    """The lock is not held while a command runs, so two may run at once: the one
    that finishes second summarised messages the first replaced, and is refused."""
    release = ledger / "release"
    with running(config(ledger, programs)) as d:
        argv = compactor(programs, ledger, "wait", str(d.socket), SESSIONCTL, str(release))
        compacting(d, "n", argv)
        d.ctl("send", "n", "third note", check=True)
        both = [
            subprocess.Popen(
                [SESSIONCTL, "compact", "n", "--keep", keep],
                env=d.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for keep in ("0", "1")
        ]
        try:
            wait_for(lambda: len(list(ledger.glob("waiting-*.json"))) == 2, what="both commands")
            release.touch()
            answers = [p.communicate(timeout=30) for p in both]
        finally:
            for p in both:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        codes = sorted(p.returncode for p in both)
        assert codes == [0, 1], answers
        refused = next(err for (_, err), p in zip(answers, both, strict=True) if p.returncode)
        assert "context changed while its compaction command ran" in refused
        assert "compact it again" in refused
        assert len(d.json("log", "n", "--type", "context.compacted")) == 1


def test_a_command_that_cannot_start_is_refused_naming_it() -> None:
    with running() as d:
        compacting(d, "gone", ["/nonexistent/summarise"])
        done = d.ctl("compact", "gone", "--keep", "0")
        assert done.returncode == 1, done
        assert "could not start '/nonexistent/summarise'" in done.stderr, done.stderr
        assert "No such file or directory" in done.stderr
        assert not d.json("log", "gone", "--type", "context.compacted")
