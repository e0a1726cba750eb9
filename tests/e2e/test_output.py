"""``sessionctl output`` and ``status`` on the real daemon: a finished run's output
from its artifacts, a given run's, stderr, the last N lines, a running run's output
before it ends, ``-f`` following it into the next run, and the errors a person
gets for an unknown session, a run that does not exist and a session that has
not run."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import orjson

from tests.e2e.harness import AT_A_TERMINAL, SESSIONCTL, Daemon, running, wait_event, wait_for

# Prints its run's lines; the second part waits for a file the test makes (the
# program polls for it: the test itself waits on events and output, never on time).
SCRIPT = (
    'echo "run $SESSIOND_RUN line 1"; echo "run $SESSIOND_RUN line 2"; '
    'echo "oops from $SESSIOND_RUN" >&2; echo "secret hunter2"; '
    'while [ ! -e "go-$SESSIOND_RUN" ]; do sleep 0.02; done; '
    'echo "run $SESSIOND_RUN line 3"; [ "$SESSIOND_RUN" != r2 ]'
)


def _create(d: Daemon, name: str = "job") -> Path:
    ws = d.root / "ws"
    ws.mkdir(exist_ok=True)
    d.write_spec(
        name,
        f'name = "{name}"\nredact = ["hunter[0-9]"]\n[run]\n'
        f'exec = ["sh", "-c", {orjson.dumps(SCRIPT).decode()}]\n'
        f'cwd = "{ws}"\nretries = 0\n[[trigger]]\ntype = "message"\n',
    )
    d.ctl("create", str(d.root / f"{name}.toml"), check=True)
    return ws


def _out(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return d.ctl("output", *args)


def test_output_of_a_running_run_then_of_finished_runs() -> None:
    with running() as d:
        ws = _create(d)
        d.ctl("activate", "job", check=True)
        # the running run's output, before it ends (and masked like its artifact)
        live = wait_for(lambda: "line 2" in (r := _out(d, "job")).stdout and r, what="live output")
        assert live.returncode == 0, live.stderr
        # whole lines only, and masked as its artifact will be
        assert live.stdout.startswith("run r1 line 1\nrun r1 line 2\n"), live.stdout
        assert "hunter2" not in live.stdout
        shown = d.json("output", "job")
        assert shown["running"] is True
        assert shown["run"] == "r1"
        (ws / "go-r1").touch()
        wait_event(d, "job", "run.finished")
        done = _out(d, "job")
        assert done.stdout.startswith(live.stdout)  # what was served is a prefix
        assert done.stdout.endswith("run r1 line 3\n")
        assert "hunter2" not in done.stdout
        assert _out(d, "job", "--stderr").stdout == "oops from r1\n"
        assert _out(d, "job", "-n", "1").stdout == "run r1 line 3\n"
        # a second run: the newest by default, the first with --run r1
        (ws / "go-r2").touch()
        d.ctl("send", "job", "again", check=True)
        wait_event(d, "job", "run.finished", match=lambda r: r["data"]["run"] == "r2")
        assert _out(d, "job", "-n", "1").stdout == "run r2 line 3\n"
        assert _out(d, "job", "--run", "r1", "-n", "1").stdout == "run r1 line 3\n"
        # -f of a run that has ended: all of it, then it returns (nothing more will come)
        ended = d.ctl("output", "job", "-f", "--run", "r1", "-n", "2", timeout=30)
        assert ended.returncode == 0, ended.stderr
        assert ended.stdout == "secret [REDACTED]\nrun r1 line 3\n"
        d.stop()


def test_output_errors_name_what_was_wrong() -> None:
    with running() as d:
        _create(d)
        unknown = _out(d, "jbo")
        assert unknown.returncode == 4, unknown.stderr
        assert "no session 'jbo'" in unknown.stderr
        assert "did you mean 'job'?" in unknown.stderr
        never = _out(d, "job")
        assert never.returncode == 1
        assert "has not run yet" in never.stderr
        assert "sessionctl activate job" in never.stderr
        status = d.ctl("status", "job")
        assert status.returncode == 0, status.stderr
        assert "no run yet" in status.stdout
        d.ctl("activate", "job", check=True)
        (d.root / "ws" / "go-r1").touch()
        wait_event(d, "job", "run.finished")
        missing = _out(d, "job", "--run", "r7")
        assert missing.returncode == 1
        assert "has no run r7: its runs are r1 to r1" in missing.stderr
        bad = _out(d, "job", "--run", "seven")
        assert bad.returncode == 5
        assert "runs are named r1, r2" in bad.stderr
        status = d.ctl("status", "job")
        assert status.returncode == 0, status.stderr
        assert "session: job" in status.stdout
        assert "run.finished" in status.stdout  # the last log lines
        assert "run r1 line 3" in status.stdout  # the newest run's last lines
        d.stop()


def test_follow_reads_a_run_as_it_prints_and_goes_on_to_the_next() -> None:
    with running() as d:
        ws = _create(d)
        follow = subprocess.Popen(
            [*AT_A_TERMINAL, SESSIONCTL, "output", "job", "-f"],
            env=d.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        changed = threading.Condition()

        def read() -> None:
            assert follow.stdout is not None
            for line in follow.stdout:
                with changed:
                    lines.append(line)
                    changed.notify_all()

        def until(text: str) -> None:
            with changed:
                assert changed.wait_for(lambda: text in "".join(lines), 30), lines

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            d.ctl("activate", "job", check=True)  # it waited for the first run
            until("run r1 line 2\n")
            assert "run r1 line 3" not in "".join(lines)  # the run is still going
            (ws / "go-r1").touch()
            until("run r1 line 3\n")
            (ws / "go-r2").touch()
            d.ctl("send", "job", "again", check=True)
            until("run r2 line 3\n")
            assert "".join(lines) == (
                "run r1 line 1\nrun r1 line 2\nsecret [REDACTED]\nrun r1 line 3\n"
                "run r2 line 1\nrun r2 line 2\nsecret [REDACTED]\nrun r2 line 3\n"
            )
        finally:
            os.killpg(follow.pid, signal.SIGINT)  # Ctrl-C ends it
            try:
                code = follow.wait(30)
            except subprocess.TimeoutExpired:
                # fail this test alone: a follower left running (its pipes open) was
                # reported by the next test on this worker, when it was collected
                os.killpg(follow.pid, signal.SIGKILL)
                code = follow.wait(30)  # -9: the assertion below says so
            reader.join(5)
            for pipe in (follow.stdout, follow.stderr):
                if pipe is not None:
                    pipe.close()
        assert code == 0, f"sessionctl output -f did not end on Ctrl-C (exit {code})"
        d.stop()


def test_an_output_larger_than_one_answer_comes_whole_in_chunks() -> None:
    with running() as d:
        d.write_spec(
            "big",
            'name = "big"\n[run]\nexec = ["sh", "-c", "yes 0123456789 | head -n 200000"]\n'
            "retries = 0\n",
        )
        d.ctl("create", str(d.root / "big.toml"), check=True)
        d.ctl("activate", "big", check=True)
        wait_event(d, "big", "run.finished")
        # 2.2 MB: more than one answer carries (1 Mi characters), so asked in chunks
        shown = d.json("output", "big")
        assert shown["more"] is False
        assert shown["next_offset"] == len(shown["data"]) == 11 * 200000
        whole = d.ctl("output", "big")
        assert whole.returncode == 0, whole.stderr
        assert whole.stdout == "0123456789\n" * 200000  # every chunk, in order
        assert d.ctl("output", "big", "-n", "2").stdout == "0123456789\n" * 2
        quiet = d.ctl("output", "big", "--stderr")  # a run with nothing there: it says so
        assert quiet.returncode == 0
        assert quiet.stdout == ""
        assert "run r1 printed nothing on stderr" in quiet.stderr
        assert "its stdout has 200000 line(s)" in quiet.stderr
        d.stop()
