"""A connection the early server held is judged, by the full server, as the
process that connected when it was accepted: not as whatever process has its
pid by the time the full server takes over (seconds later, at 10,000 sessions).

Where the kernel gives a pidfd for a process gone (SO_PEERPIDFD, Linux 6.16 and
later), a process that connected and exited is refused either way. Where it
gives none (before 6.5, or 6.5-6.15 once the process is reaped), the pin is the
pid and its start time: read at accept by the early server, but read again at
the hand-over, a run's process could connect, leave a request, exit, and have
its request judged by an operator's process that took its pid meanwhile.

The scenario runs in a pid namespace of its own (so that the pid can be handed
on at will, through its ns_last_pid, without touching the machine's): the real
early server on a real socket, the real full server's adoption of what it held
(its dispatch a recorder: what matters is the caller it is given), a kernel
without SO_PEERPIDFD (the option made one the kernel does not know)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

SCENARIO = r"""
import asyncio, collections, os, socket, subprocess, sys, types
from pathlib import Path

import orjson

from sessiond.ipc import runpeer

runpeer.SO_PEERPIDFD = 0x7FFF  # a kernel that gives no pidfd: getsockopt fails
from sessiond.ipc.early import EarlyConfig, open_server
from sessiond.ipc.server import Server

root = Path(sys.argv[1])
state = root / "state"
(state / "sessions").mkdir(parents=True)
config = EarlyConfig(state, root / "sock" / "s.sock", True, 0.0)
early = open_server(config, os.open(state / "sessiond.lock", os.O_RDWR | os.O_CREAT, 0o600))

# a run's process: pings (so it was accepted), leaves a suspend, exits
RUN = r'''
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"id":1,"method":"ping","params":{}}\n{"id":2,"method":"suspend","params":{"name":"a"}}\n')
assert s.makefile("rb").readline()
'''
env = {k: v for k, v in os.environ.items() if k != "SESSIOND_RUN_MARK"}
run = subprocess.run([sys.executable, "-c", RUN, str(config.socket)],
                     env={**env, "SESSIOND_RUN_MARK": "x:a:1"}, check=True)
run_pid = None
for c in early._conns.values():
    run_pid = c.examiner.pid if c.examiner is not None else None

# an operator's process takes its pid: started by a helper that exits at once, so
# that it descends from neither this process nor anything of a run
HELPER = '''
import os, subprocess, sys
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(int(sys.argv[1]) - 1))
o = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(o.pid, flush=True)
os._exit(0)
'''
r, w = os.pipe()
helper = subprocess.run([sys.executable, "-c", HELPER, str(run_pid)], env=env, stdin=r,
                        capture_output=True, text=True, check=True)
os.close(r)
taker = int(helper.stdout)

listening, held = early.hand_over()
seen = []


class Recorder:
    async def handle(self, line, frames, writer, caller):
        seen.append({"line": orjson.loads(line), "refused": caller.refused()})
        writer.close()


server = Server.__new__(Server)
server.config = types.SimpleNamespace(max_connections=64, read_timeout=60.0,
                                      max_frame_bytes=1 << 20)
server.endpoint = "control"
server._connections = set()
server._per_uid = collections.Counter()
server.peers = types.SimpleNamespace(allowed=lambda peer, programs=False: True,
                                     run_uids=range(458752, 524288))
server.dispatch = Recorder()


async def main():
    for h in held:
        server._adopt(h)
    while server._connections:
        await asyncio.wait(set(server._connections))


asyncio.run(main())
os.close(w)  # the operator's process ends
listening.close()
print(orjson.dumps({"run_pid": run_pid, "taker": taker, "seen": seen}).decode())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="root, unshare")
def test_a_held_request_is_judged_as_the_process_that_connected(tmp_path: Path) -> None:
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    root = tmp_path / "root"
    # pid 1 of the namespace is the shell (the scenario is not: what is orphaned
    # reparents to pid 1, and the daemon's own descendants count as a run's)
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", '"$@"; exit $?', "sh",
         sys.executable, str(script), str(root)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = orjson.loads(done.stdout.splitlines()[-1])
    # the operator's process did take the run's pid (its namespace's next pid)
    assert out["taker"] == out["run_pid"]
    [suspend] = out["seen"]
    assert suspend["line"]["method"] == "suspend"
    # judged as the run's process that connected (gone), not as the one with its pid now
    assert suspend["refused"] is not None
    assert "may only ping" in suspend["refused"]
