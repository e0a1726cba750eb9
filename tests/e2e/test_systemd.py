"""systemd: the notify protocol on a real datagram socket, socket activation, and
the unit files checked by systemd-analyze."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sessiond.cluster.lease import LEASE_LOST_EXIT
from tests.e2e.harness import SESSIONCTL, SESSIOND, Daemon, short_dir

ROOT = Path(__file__).parents[2]


def _receive(sock: socket.socket, want: str, timeout: float = 20.0) -> str:
    sock.settimeout(timeout)
    while True:
        message = sock.recv(4096).decode()
        if want in message.split("\n"):
            return message


def test_the_daemon_speaks_the_notify_protocol() -> None:
    root = short_dir()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(root / "notify"))
    try:
        d = Daemon(root, env={"NOTIFY_SOCKET": str(root / "notify"), "WATCHDOG_USEC": "400000"})
        d.write_spec("n", 'name = "n"\n')
        d.start()
        ready = _receive(notify, "READY=1")
        assert "STATUS=0 sessions" in ready
        assert f"MAINPID={d.proc.pid}" in ready  # type: ignore[union-attr]
        d.ctl("create", str(root / "n.toml"), check=True)
        _receive(notify, "WATCHDOG=1", timeout=5)  # at half of WatchdogSec
        status = _receive(notify, "STATUS=1 sessions: 1 created", timeout=5)
        assert "STATUS=1 sessions: 1 created" in status
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        assert "RELOADING=1" in _receive(notify, "RELOADING=1")
        _receive(notify, "READY=1")
        d.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert "STOPPING=1" in _receive(notify, "STOPPING=1")
        assert d.stop() == 0
    finally:
        notify.close()
        shutil.rmtree(root, ignore_errors=True)


def test_socket_activation_serves_the_socket_systemd_passes() -> None:
    root = short_dir()
    path = root / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    try:
        fd = listener.fileno()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIOND_")}
        env["LISTEN_FDS"] = "1"
        # What systemd does before exec: the socket as fd 3, LISTEN_PID = the daemon's pid.
        launcher = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); "
            "os.environ['LISTEN_PID'] = str(os.getpid()); os.execv(sys.argv[2], sys.argv[2:])"
        )
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                launcher,
                str(fd),
                SESSIOND,
                "--state-dir",
                f"{root}/state",
                "--socket",
                f"{root}/unused.sock",
            ],
            env=env,
            pass_fds=(fd,),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        listener.close()  # the daemon holds it now
        assert proc.stderr is not None
        for raw in proc.stderr:
            if b"daemon.ready" in raw:
                break
        done = subprocess.run(
            [SESSIONCTL, "--socket", str(path), "--json", "ping"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert f'"pid":{proc.pid}' in done.stdout
        assert not (root / "unused.sock").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        proc.stderr.close()
        assert path.exists()  # systemd owns the socket file; the daemon leaves it
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here"
)
@pytest.mark.parametrize(
    "units",
    [["sessiond.service", "sessiond.socket"], ["user/sessiond.service"], ["sessiond@.service"]],
    ids=["system", "user", "cluster-node"],
)
def test_the_unit_files_pass_systemd_analyze_verify(units: list[str], tmp_path: Path) -> None:
    paths = []
    for unit in units:
        text = (ROOT / "systemd" / unit).read_text()
        # As `make install` writes them: the real path of the installed sessiond.
        text = text.replace("/usr/local/bin/sessiond", SESSIOND)
        text = text.replace("%h/.local/bin/sessiond", SESSIOND)
        # A template is checked as an instance of it, its %i filled in.
        target = tmp_path / Path(unit).name.replace("@.", "@node1.")
        target.write_text(text)
        paths.append(str(target))
    done = subprocess.run(
        ["systemd-analyze", "verify", *paths],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "sessiond" not in done.stderr, done.stderr


@pytest.mark.parametrize("unit", ["sessiond.service", "user/sessiond.service", "sessiond@.service"])
def test_the_units_delegate_a_cgroup_the_daemon_can_write(unit: str) -> None:
    """Delegate=yes gives each run a cgroup only if /sys/fs/cgroup stays writable:
    ProtectControlGroups=yes (or strict) would mount it read-only."""
    lines = [x.strip() for x in (ROOT / "systemd" / unit).read_text().splitlines()]
    settings = [x for x in lines if x and not x.startswith("#")]
    assert "Delegate=yes" in settings
    protect = [x for x in settings if x.startswith("ProtectControlGroups=")]
    assert protect in ([], ["ProtectControlGroups=no"]), protect


def test_the_cluster_node_template_starts_a_node_again_when_it_exits_75() -> None:
    """A node ends with 75 when its lease lapses or its database is away
    (cluster/lease.py): the template restarts it for that, without a start limit
    that would give up while the database is down, and not for a refused config."""
    lines = [x.strip() for x in (ROOT / "systemd" / "sessiond@.service").read_text().splitlines()]
    settings = [x for x in lines if x and not x.startswith("#")]
    assert LEASE_LOST_EXIT == 75
    assert "Restart=on-failure" in settings
    assert f"RestartForceExitStatus={LEASE_LOST_EXIT}" in settings
    assert "StartLimitIntervalSec=0" in settings
    assert "RestartPreventExitStatus=2" in settings
    start = next(x for x in settings if x.startswith("ExecStart="))
    assert "--config /etc/sessiond/%i.toml" in start
    assert "--socket /run/sessiond/%i/sessiond.sock" in start
