"""`sessionctl ps` for many sessions and the conventions of systemctl and journalctl
(issue 26): filters and order applied by the daemon, terminated sessions hidden
after an hour with a footer saying so, one "last active", did-you-mean, the
command's own usage, log --all without -f, --until, -o, start/stop/restart."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios

import orjson

from tests.e2e.harness import SESSIONCTL, Daemon, running, short_dir, wait_for

SPEC = (
    'name = "{name}"\nagent = "{agent}"\nlabels = {{ team = "{team}" }}\n'
    '[run]\nexec = ["true"]\ncwd = "{ws}"\n'
)


def _make(d: Daemon, name: str, agent: str, team: str) -> None:
    spec = d.write_spec(name, SPEC.format(name=name, agent=agent, team=team, ws=d.root))
    d.ctl("create", str(spec), check=True)


def _names(d: Daemon, *args: str) -> list[str]:
    return [r["name"] for r in d.json(*args)]


def test_ps_filters_sorts_and_hides_old_terminated_sessions() -> None:
    root = short_dir()
    d = Daemon(root).start()
    try:
        _make(d, "zeta", "alpha", "red")
        _make(d, "beta", "omega", "blue")
        _make(d, "gamma", "alpha", "blue")
        _make(d, "old", "alpha", "red")
        d.ctl("suspend", "beta", check=True)
        d.ctl("cancel", "old", check=True)
        # grouped by owning agent (docs/spec.md), then by name
        assert _names(d, "ps") == ["gamma", "old", "zeta", "beta"]
        assert _names(d, "ps", "--sort", "name") == ["beta", "gamma", "old", "zeta"]
        assert _names(d, "ps", "--state", "suspended") == ["beta"]
        assert _names(d, "ps", "--state", "suspended,terminated") == ["old", "beta"]
        assert _names(d, "ps", "--state", "suspended", "--state", "terminated") == ["old", "beta"]
        assert _names(d, "ps", "--agent", "alpha", "--label", "team=red") == ["old", "zeta"]
        assert _names(d, "ps", "--label", "team=blue", "--sort", "state") == ["beta", "gamma"]
        bad = d.ctl("ps", "--state", "blokced")
        assert bad.returncode == 2
        assert "did you mean 'blocked'" in bad.stderr
        assert bad.stderr.startswith("usage: sessionctl ps")
        # ps and show: one "last active"
        row = next(r for r in d.json("ps") if r["name"] == "zeta")
        assert row["last_active"] == d.json("show", "zeta")["last_active"] is not None
        d.stop()
        # Two hours on: "old" was terminated more than an hour ago.
        d.config.write_text(d.config.read_text() + "clock_offset = 7200.0\n")
        d.start()
        assert "old" not in _names(d, "ps")
        table = d.ctl("ps", check=True).stdout
        assert "old" not in table.split()
        assert "1 terminated session hidden" in table
        assert "--all shows them" in table
        assert "old" in _names(d, "ps", "--all")
        assert "old" in _names(d, "ps", "--state", "terminated")  # asked for by name
    finally:
        d.stop()


def test_did_you_mean_usage_start_stop_restart_and_log_forms() -> None:
    with running() as d:
        _make(d, "worker", "ops", "red")
        _make(d, "helper", "ops", "red")
        typo = d.ctl("shw", "worker")
        assert typo.returncode == 2
        assert "did you mean 'show'" in typo.stderr
        assert "activate" not in typo.stderr  # not the list of every command
        usage = d.ctl("ps", "--bogus")
        assert usage.returncode == 2
        assert usage.stderr.startswith("usage: sessionctl ps ")
        missing = d.ctl("show", "worke")
        assert missing.returncode == 4
        assert "did you mean 'worker'" in missing.stderr
        # start = (resume and) activate; stop = suspend; restart = interrupt + activate
        assert d.ctl("stop", "worker", check=True).stdout.startswith("stopped worker: suspended")
        assert "stopped already" in d.ctl("stop", "worker", check=True).stdout
        started = d.ctl("start", "worker", check=True).stdout
        assert started.startswith("started worker: ")
        assert d.json("show", "worker")["state"] != "suspended"
        assert d.json("show", "worker")["runs"] >= 1
        assert d.ctl("restart", "helper", check=True).stdout.startswith("restarted helper: ")
        # log --all without -f: every session's events, merged in time order
        every = d.ctl("log", "--all", "-o", "json-lines", check=True).stdout.splitlines()
        records = [orjson.loads(line) for line in every]
        assert {r["session"] for r in records} == {"worker", "helper"}
        assert [r["ts"] for r in records] == sorted(r["ts"] for r in records)
        # --since today / -1h, --until: a window; -o cat: the text alone; --json: an array
        today = d.json("log", "worker", "--since", "today")
        assert today
        assert today == d.json("log", "worker", "--since", "-1h")
        assert d.json("log", "worker", "--until", "yesterday") == []
        assert d.json("log", "worker", "-o", "json") == today
        cat = d.ctl("log", "worker", "-o", "cat", check=True).stdout
        assert "session.created" not in cat
        assert "worker" in cat.splitlines()[0]
        follow_json = d.ctl("log", "worker", "-f", "-o", "json")
        assert follow_json.returncode == 2
        assert "json-lines" in follow_json.stderr
        for line in d.ctl("log", "--all", check=True).stdout.splitlines():
            assert "None" not in line
            assert "by -" not in line


def test_start_stop_restart_on_a_running_program() -> None:
    with running() as d:
        spec = 'name = "long"\n[run]\nexec = ["sleep", "300"]\ncwd = "{ws}"\n'
        d.ctl("create", str(d.write_spec("long", spec.format(ws=d.root))), check=True)
        d.ctl("start", "long", check=True)
        first = wait_for(lambda: _running(d), what="long running")
        assert "running already" in d.ctl("start", "long", check=True).stdout
        assert d.ctl("restart", "long", check=True).stdout.startswith("restarted long: ")
        second = wait_for(lambda: _running(d), what="long running again")
        assert second["pid"] != first["pid"]
        assert second["runs"] == first["runs"] + 1
        stopped = d.ctl("stop", "long", check=True)
        assert stopped.stdout.startswith("stopped long: suspended"), stopped.stdout
        shown = d.json("show", "long")
        assert shown["state"] == "suspended"
        assert shown["pid"] is None
        d.ctl("start", "long", check=True)  # resumed, then woken
        assert wait_for(lambda: _running(d), what="long running after start")["runs"] == 3


def _running(d: Daemon) -> dict[str, object] | None:
    shown: dict[str, object] = d.json("show", "long")
    return shown if shown["state"] == "running" and shown["pid"] else None


def test_ps_cuts_cells_with_an_ellipsis_only_on_a_terminal() -> None:
    program = "/no/such/program/with/a/rather/long/name/so/that/its/reason/is/long"
    with running() as d:
        # no retries: it blocks at once, and its reason stays
        spec = f'name = "bad"\n[run]\nexec = ["{program}"]\ncwd = "{d.root}"\nretries = 0\n'
        d.ctl("create", str(d.write_spec("bad", spec)), check=True)
        d.ctl("activate", "bad", check=True)
        reason = wait_for(lambda: _failed(d), what="bad blocked by its failed start")
        assert len(reason) > 60
        piped = d.ctl("ps", check=True).stdout
        assert reason in piped  # whole when piped: grep and awk see all of it
        assert "…" not in piped
        on_terminal = _on_a_terminal(d, "ps")
        assert "…" in on_terminal
        assert reason not in on_terminal
        assert reason[:40] in on_terminal
        assert reason in _on_a_terminal(d, "ps", "--full").replace("\r\n", "\n")


def _failed(d: Daemon) -> str | None:
    shown = d.json("show", "bad")
    return str(shown["reason"]) if shown["state"] == "blocked" else None


def _on_a_terminal(d: Daemon, *args: str) -> str:
    """What sessionctl prints with a terminal (a pty, wide enough) as its stdout."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))
    env = {**d.env, "NO_COLOR": "1"}
    with os.fdopen(main, "rb", buffering=0) as reader:
        done = subprocess.run(
            [SESSIONCTL, *args], stdout=side, stderr=subprocess.PIPE, env=env, timeout=60,
            check=False,
        )  # fmt: skip
        os.close(side)
        assert done.returncode == 0, done.stderr
        chunks = []
        while True:
            try:
                chunk = reader.read(65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode()


WAITS = """name = "waits"
[run]
exec = ["sh", "-c", "while [ ! -e release ]; do sleep 0.05; done; echo done; exit $(cat release)"]
cwd = "{ws}"
retries = 0

[[trigger]]
type = "message"
"""


def test_activate_start_and_restart_wait_for_the_run_they_started() -> None:
    """``--wait`` returns only once the run has finished, and says how it ended in
    its exit code: a script can read the run's log right after it."""
    with running() as d:
        release = d.root / "release"
        d.ctl("create", str(d.write_spec("waits", WAITS.format(ws=d.root))), check=True)
        plain = [("activate", "0", 1, "now sleeping"), ("restart", "3", None, "now blocked")]
        for verb, code, run, after in plain:
            waiting = subprocess.Popen(
                [SESSIONCTL, verb, "waits", "--wait"],
                env=d.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                wait_for(lambda: d.json("show", "waits")["state"] == "running", what="the run")
                # the run is held on the release file: the command has not returned
                assert waiting.poll() is None
                release.write_text(code)
                out, err = waiting.communicate(timeout=60)
            finally:
                if waiting.poll() is None:
                    waiting.kill()
                    waiting.communicate()
            ok = code == "0"
            assert waiting.returncode == (0 if ok else 1), (out, err)
            said = f"run r{run or '[34]'} {'ok' if ok else 'failed'} exit={code}; {after}"
            assert re.search(f"waits: {said}", out), out
            release.unlink()
            if ok:  # without --wait the command returns while the run goes on
                d.ctl("start", "waits", check=True)
                assert d.json("show", "waits")["state"] == "running"
                again = subprocess.Popen(
                    [SESSIONCTL, "start", "waits", "--wait"],  # waits for the run
                    env=d.env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                try:
                    release.write_text("0")
                    done, _ = again.communicate(timeout=60)
                finally:
                    if again.poll() is None:
                        again.kill()
                        again.communicate()
                # r2 (running already, if start asked before it ended) or a new r3
                assert re.search(r"waits: run r[23] ok exit=0; now sleeping", done), done
                assert "done" in d.ctl("output", "waits", check=True).stdout
                release.unlink()
