"""Integers no float holds, and integers of more digits than Python reads, in a
daemon's configuration and in a session's spec: a clear error naming the key,
never a traceback (the daemon's start) nor an "internal error" (a create)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.e2e.harness import SESSIOND, Daemon, short_dir

HUGE = "1" + "0" * 400  # no float holds it
LONG = "1" + "0" * 5000  # more digits than int() reads from text


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (f"clock_offset = {HUGE}", "is not a clock offset"),
        (f"aging = {HUGE}", "aging: a duration is at most 100 years"),
        (f"clock_offset = {LONG}", "not valid TOML"),
    ],
)
def test_a_config_with_a_huge_integer_is_refused_clearly(line: str, said: str) -> None:
    root = short_dir()
    try:
        (root / "state").mkdir(mode=0o700)
        config = root / "sessiond.toml"
        config.write_text(f'state_dir = "state"\n{line}\n')
        done = subprocess.run(
            [SESSIOND, "--config", str(config), "--socket", str(root / "s.sock")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode != 0
        assert "Traceback" not in done.stderr, done.stderr
        assert said in done.stderr, done.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (f'[run]\nexec = ["true"]\ntimeout = {HUGE}\n', "run.timeout: a number beyond 64 bits"),
        (
            f'[run]\nexec = ["true"]\n[[trigger]]\ntype = "every"\ninterval = {HUGE}\n',
            "trigger[0].interval: a number beyond 64 bits",
        ),
        (f"priority = {LONG}\n", "not valid TOML"),
    ],
)
def test_a_spec_with_a_huge_integer_is_refused_clearly(extra: str, said: str) -> None:
    root = short_dir()
    d = Daemon(root)
    try:
        d.start()
        spec = d.write_spec("a", f'name = "a"\n{extra}')
        done = d.ctl("create", str(spec))
        assert done.returncode != 0
        assert "internal error" not in done.stderr, done.stderr
        assert said in done.stderr, done.stderr
        assert d.ctl("ping").returncode == 0  # and the daemon serves on
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_spec_with_an_integer_beyond_64_bits_creates_nothing() -> None:
    # Attack: [budget] tokens has no upper bound; a create with 10**30 was accepted,
    # its folder made, and its first event failed to encode ("internal error"):
    # a session with no event at all was left in the table.
    root = short_dir()
    d = Daemon(root)
    try:
        d.start()
        text = 'name = "a"\n[run]\nexec = ["true"]\n[budget]\ntokens = 1' + "0" * 30 + "\n"
        done = d.ctl("create", str(d.write_spec("a", text)))
        assert done.returncode != 0
        assert "internal error" not in done.stderr, done.stderr
        assert "budget.tokens: a number beyond 64 bits" in done.stderr, done.stderr
        assert d.json("ps", "--all") == []  # nothing half made
        assert not (d.state_dir / "sessions" / "a").exists()
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)
