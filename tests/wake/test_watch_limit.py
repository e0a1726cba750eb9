"""A new watcher that cannot be built beside the live one: the inotify watches of
the roots both watch are held twice while the one replaces the other, and the
user's limit on them may not allow it (watchfiles, passing over the folders it may
not read, passes over that too, silently). Run in a user and mount namespace of its
own, whose limit the test lowers (the machine's stays as it is), with its folders
at a fixed place and a fixed hash seed: the order of the roots is known."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Both scripts, once their watcher watches: a file written, its wake (20 s at most)
# printed last.
THEN = """
    written.write_text("1\\n")
    try:
        await asyncio.wait_for(kernel.woken.wait(), 20)
    except TimeoutError:
        print("no wake")
    await triggers.watcher.close()
    print(kernel.wakes)


asyncio.run(go())
"""

SCRIPT = (
    """
import asyncio, sys
from pathlib import Path

from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec
from sessiond.wake.armed import Armed
from sessiond.wake.triggers import Triggers
from tests.wake.test_watch_looks import Kernel, Sleeping, until

base = Path(sys.argv[1])
assert list(frozenset([str(base / "a"), str(base / "b")]))[0] == str(base / "a")
for n in range(40):  # 42 watches for a: 84 with a new watcher beside the live one
    (base / "a" / "data" / f"d{n}").mkdir(parents=True)
(base / "b" / "data").mkdir(parents=True)
with open("/proc/sys/user/max_inotify_watches", "w") as f:
    f.write("60")


def armed(name):
    text = (f'name = "{name}"\\n[run]\\nexec = ["true"]\\ncwd = "."\\n'
            '[[trigger]]\\ntype = "watch"\\npaths = ["data/*.csv"]\\n')
    return Armed(Session(name, Sleeping(), parse_spec(text, base=base / name)))


async def go():
    kernel = Kernel()
    triggers = Triggers(kernel, lambda: 0.0, poll_step_ms=15)
    triggers.armed["a"] = armed("a")
    triggers.watcher.restart()
    await until(lambda: triggers.watcher._live is not None, "the first watcher")
    triggers.armed["b"] = armed("b")
    triggers.watcher.restart()
    await until(lambda: triggers.watcher._next is None, "the second watcher's start")
    written = base / "b" / "data" / "x.csv"
"""
    + THEN
)


def test_a_watcher_the_inotify_limit_refuses_beside_the_live_one_is_built_alone(
    tmp_path: Path,
) -> None:
    """The new watcher watched what the limit left of its first root (the live one's)
    and none of the new session's folder, which the reconciliation alone (every
    30 s) then saw; the live one ended all the same."""
    unshare = ["unshare", "-Urm", "sh", "-c", 'mount --bind "$0" /mnt && exec "$@"']
    if subprocess.run([*unshare, str(tmp_path), "true"], check=False).returncode != 0:
        pytest.skip("no user and mount namespaces here")
    done = subprocess.run(
        [*unshare, str(tmp_path), sys.executable, "-c", SCRIPT, "/mnt"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONHASHSEED": "3"},
    )
    assert done.returncode == 0, done.stderr
    assert "watch.failed" in done.stdout  # the limit was met
    assert done.stdout.strip().splitlines()[-1] == "[('b', 'watch', {'paths': ['data/x.csv']})]"


DENIED = (
    """
import asyncio, sys
from pathlib import Path

from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec
from sessiond.wake.armed import Armed
from sessiond.wake.triggers import Triggers
from tests.wake.test_watch_looks import Kernel, Sleeping, until

base = Path(sys.argv[1])


async def go():
    kernel = Kernel()
    triggers = Triggers(kernel, lambda: 0.0, poll_step_ms=15)
    text = ('name = "a"\\n[run]\\nexec = ["true"]\\ncwd = "."\\n'
            '[[trigger]]\\ntype = "watch"\\npaths = ["data/*.csv"]\\n')
    triggers.armed["a"] = Armed(Session("a", Sleeping(), parse_spec(text, base=base)))
    triggers.watcher.restart()
    await until(lambda: triggers.watcher._next is None, "the watcher's start")
    written = base / "data" / "x.csv"
"""
    + THEN
)


def test_a_folder_the_daemon_may_not_read_is_passed_over_and_the_rest_watched(
    tmp_path: Path,
) -> None:
    """A watcher is built strict first (so that the limit is not passed over in
    silence): a folder it may not read fails that build, and the next one passes
    over it. Run in a user namespace of its own whose root is the machine's: the
    folder belongs to a uid the namespace does not map (nobody), so no capability
    reads it there and its mode (none) holds, while the checkout stays readable
    (running as nobody instead could not read a checkout closed to others)."""
    unshare = ["unshare", "-Ur"]
    if subprocess.run([*unshare, "true"], check=False).returncode != 0:
        pytest.skip("no user namespaces here")
    workspace = tmp_path / "w"
    (workspace / "data").mkdir(parents=True)
    (workspace / "closed").mkdir(mode=0o000)
    os.chown(workspace / "closed", 65534, 65534)
    try:
        done = subprocess.run(
            [*unshare, sys.executable, "-c", DENIED, str(workspace)],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        (workspace / "closed").chmod(0o700)
    assert done.returncode == 0, done.stderr
    assert "watch.failed" in done.stdout  # the strict build met the closed folder
    assert done.stdout.strip().splitlines()[-1] == "[('a', 'watch', {'paths': ['data/x.csv']})]"
