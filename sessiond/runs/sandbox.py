"""The boundary: every process started for a session runs confined by the kernel.

``Boundary.plan`` makes a session's ``MountPlan`` (what its processes see, which
uid they have) and ``confine`` turns a command into ``bwrap … -- command``: the
one place a process on a session's behalf is wrapped (its program through
``Program.send``; any other command started for the session goes through
``RunContext.confinement`` and ``confine`` too). The spawner's holder then
starts bubblewrap as it would start the program.

What a run sees: the whole file system read-only (``--ro-bind / /``), a fresh
``/dev`` and ``/proc`` (its own pid namespace: it cannot see or signal the
spawner, its holder, the daemon, or any other run), a private ``/tmp``, its
workspace read-write (or, when the spec declares ``writes``, only those paths),
a private ``HOME`` that lasts from run to run, the daemon's program endpoint
and its own wake file. Hidden (an empty tmpfs over a folder, ``/dev/null`` over
a file): the daemon's state dir (the logs, the console's keys and logins),
the control socket's folder, the daemon's configuration file (it may hold the
cluster's dsn), the console's TLS key, the notices files, and every other
session's workspace. ``--new-session`` keeps it from the terminal (no
TIOCSTI), ``--die-with-parent`` ties it to its holder, and bubblewrap sets
``no_new_privs``, so no setuid program raises it.

A root daemon gives each session a uid of its own (sessiond.runs.uids):
bubblewrap starts as root, and ``setpriv`` drops to the uid, its own gid and no
supplementary groups, with every capability gone, right before the program.

Where bubblewrap (or ``setpriv``, for a root daemon) is missing, or the kernel
cannot make the namespaces, a run does not start: ``SandboxUnavailable`` says
what is missing and the two ways on (install it, or ``[run] sandbox = "off"``
in the daemon's configuration, which ``ps``, ``show`` and ``/metrics`` then
report as the boundary being off).
"""

from __future__ import annotations

import asyncio
import errno
import glob
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from sessiond.config import DaemonConfig, RunConfig
from sessiond.paths import gateway_socket, program_socket
from sessiond.runs.agents import AGENT_KINDS, agent_home
from sessiond.runs.uids import DynamicUids, open_to, own, reach
from sessiond.sandboxconfig import dynamic_uids_on
from sessiond.table.spec import SessionSpec

PROBE_TIMEOUT = 10.0
RELAY = str(Path(__file__).with_name("gwrelay.py"))  # shown to runs with the package
OFF_HINT = 'or set [run] sandbox = "off" in the daemon\'s configuration (runs are then unconfined)'


class SandboxUnavailable(OSError):
    """A run cannot be confined here (or its plan is refused): the message says
    what is missing and how to go on. A run that meets it does not start."""


@dataclass(frozen=True)
class MountPlan:
    """What one session's processes see and who they are (see the module's docstring)."""

    bwrap: str  # absolute path of bubblewrap
    cwd: str
    network: str  # host | none
    # bubblewrap options in the order they apply: (option, source, target)
    mounts: tuple[tuple[str, str, str], ...]
    env: tuple[tuple[str, str], ...]  # --setenv
    drop: tuple[str, int, int] | None  # (setpriv's path, uid, gid) for a root daemon
    home: str
    # a run without a network that may call the model gateway: (its socket, its port)
    relay: tuple[str, int] | None = None

    @property
    def uid(self) -> int | None:
        return self.drop[1] if self.drop is not None else None


def confine(argv: list[str], plan: MountPlan) -> list[str]:
    """``argv`` as it runs inside the session's sandbox."""
    out = [plan.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if plan.network == "none":
        out.append("--unshare-net")
    out += ["--die-with-parent", "--new-session"]
    out += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    out += ["--perms", "1777", "--tmpfs", "/tmp"]
    for option, source, target in plan.mounts:
        if option == "--dir":
            out += ["--perms", "0755", option, target]
        else:
            out += [option, target] if option == "--tmpfs" else [option, source, target]
    for name, value in plan.env:
        out += ["--setenv", name, value]
    out += ["--chdir", plan.cwd, "--"]
    if plan.drop is not None:
        setpriv, uid, gid = plan.drop
        out += [
            setpriv,
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]
    if plan.relay is not None:  # the gateway at the same address (runs.gwrelay)
        sock, port = plan.relay
        argv = [sys.executable, "-I", RELAY, str(port), sock, "--", *argv]
    return out + list(argv)


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _notice_files(config: DaemonConfig) -> list[str]:
    found = []
    for target in config.notify:
        parts = urlsplit(target.url)
        if parts.scheme == "jsonl":
            where = unquote(parts.netloc + parts.path)
            found.append(where if where.startswith("/") else str(config.state_dir / where))
    return found


def protected(config: DaemonConfig) -> list[str]:
    """What no run may see, whatever a spec declares."""
    # the socket's file too: its folder may be an ancestor of a workspace
    paths = [str(config.state_dir), str(config.socket.parent), str(config.socket)]
    paths += [str(p) for p in (config.source, config.web.tls_key) if p is not None]
    paths += config.model.key_files()  # a provider's key never enters a run
    return [os.path.normpath(p) for p in paths + _notice_files(config)]


def _writes(workspace: str, writes: Iterable[str]) -> list[str]:
    """The folders and files the declared ``writes`` open read-write: each path up
    to its first glob character, or its nearest existing folder when it is not
    there yet (a file a run will make)."""
    out = []
    for pattern in writes:
        plain = pattern.split("*")[0].split("?")[0].split("[")[0]
        path = os.path.normpath(os.path.join(workspace, plain))
        if glob.has_magic(pattern) and not plain.endswith("/"):
            path = os.path.dirname(path)
        while not os.path.exists(path) and _under(path, workspace) and path != workspace:
            path = os.path.dirname(path)
        out.append(path if _under(path, workspace) else workspace)
    return out


def _env(given: dict[str, str], home: Path, *, dropped: bool) -> tuple[tuple[str, str], ...]:
    """What the sandbox sets in the run's environment (what the spec sets wins)."""
    env: tuple[tuple[str, str], ...] = () if "HOME" in given else (("HOME", str(home)),)
    if dropped and "GIT_CONFIG_COUNT" not in given:
        # git refuses a repository another uid owns (the workspace is the
        # operator's): the run's own git trusts what its sandbox shows it
        env += (
            ("GIT_CONFIG_COUNT", "1"),
            ("GIT_CONFIG_KEY_0", "safe.directory"),
            ("GIT_CONFIG_VALUE_0", "*"),
        )
    return env


def _hidden_home(workspace: str) -> list[tuple[int, int, str, str, str]]:
    home = os.path.expanduser("~")
    if home in ("/", "") or not os.path.isdir(home) or _under(workspace, home):
        return []
    return [(_depth(home), 0, "--tmpfs", "", home)]


def runtime() -> list[str]:
    """The Python the daemon runs on, which its runs' ``python3`` and ``sessionctl``
    use: its installation, its venv, and the sessiond package itself (outside both
    in an editable install, `make run`'s: the checkout)."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return list(dict.fromkeys(os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, package)))


def agent_cli(spec: SessionSpec) -> list[str]:
    """The agent CLI a ``claude-code`` or ``codex`` run starts (``[claude_code] cli``,
    else ``claude`` on the run's PATH; ``[codex] cli``, else ``codex``): the folder it
    is found in and its package (up to its ``node_modules``), shown to the run like
    the daemon's Python. Installed in a checkout under /tmp (`make agents`), or a
    home folder (npm's user prefix, nvm), the run could not see or reach it
    otherwise: "No such file or directory: 'claude'"."""
    assert spec.run is not None
    if spec.run.kind == "codex":
        name = (spec.codex.cli if spec.codex is not None else None) or "codex"
    elif spec.run.kind == "claude-code":
        name = (spec.claude_code.cli if spec.claude_code is not None else None) or "claude"
    else:
        return []
    path = spec.run.env.get("PATH", os.environ.get("PATH"))
    found = shutil.which(name, path=path) if "/" not in name else name
    if found is None or not os.path.exists(found):
        return []  # (the run says so itself)
    real = os.path.realpath(found)
    top = next((p for p in Path(real).parents if p.name == "node_modules"), Path(real).parent)
    return list(dict.fromkeys([os.path.dirname(os.path.abspath(found)), str(top)]))


def _needed(ops: list[tuple[int, int, str, str, str]]) -> list[tuple[int, int, str, str, str]]:
    """Without the hides already under a hidden folder or the private /tmp (and
    under no bind back): their mount points would only show names in the empty
    folder, and a daemon of many sessions would give each run a mount apiece."""
    hidden = ["/tmp"] + [t for _, order, o, _, t in ops if order == 0 and o == "--tmpfs"]
    shown = [t for _, order, _, _, t in ops if order == 1]

    def redundant(target: str) -> bool:
        above = any(target != h and _under(target, h) for h in hidden)
        return above and not any(_under(target, b) for b in shown)

    return [op for op in ops if op[1] != 0 or not redundant(op[4])]


def _folders(ops: list[tuple[int, int, str, str, str]]) -> list[tuple[int, int, str, str, str]]:
    """The folders bubblewrap must make for the binds that land on a tmpfs (the
    private /tmp, a hidden folder), searchable by the run's uid: made by bwrap
    itself they would follow the daemon's umask (0700, a root-only path)."""
    tmpfs = ["/tmp"] + [t for _, _, o, _, t in ops if o == "--tmpfs"]
    made: dict[str, None] = {}
    for _, _, option, _, target in ops:
        if option == "--tmpfs" or target in tmpfs:
            continue
        for parent in reversed(Path(target).parents):
            folder = str(parent)
            if any(folder != t and _under(folder, t) for t in tmpfs):
                made[folder] = None
    return [(_depth(f), 0, "--dir", "", f) for f in made]


def _prepare(
    config: DaemonConfig, spec: SessionSpec, workspace: str, home: Path, uid: int | None
) -> None:
    """What the run's uid needs of the host: to run its program, and to write what
    it may write (POSIX ACLs); or only its home, where it has the daemon's uid."""
    assert spec.run is not None
    run = spec.run
    if uid is None:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        return
    _reachable(_exe(run.exec[0], workspace), workspace, uid)
    home_hidden = bool(_hidden_home(workspace))
    for path in [*runtime(), *agent_cli(spec)]:
        # shown to the run by a bind (Boundary.plan_sync); where it lies under a
        # folder closed to others (a 0700 home) the uid needs a way through it too,
        # except where the sandbox lays the path out itself
        if not _under(path, "/tmp") and not (home_hidden and _under(path, os.path.expanduser("~"))):
            reach(Path(path), uid)
    never = set(protected(config)) - {str(config.socket.parent)}
    inside = {str(config.socket.parent)}
    for path in dict.fromkeys([workspace, *config.run.writable, *run.writable]):
        # The run's home is the uid's own already (Boundary._identity), and it lies in
        # the state dir: opening it would give the uid a way into the daemon's
        # folders above it (a command of a session with no [run] works in its home).
        if os.path.isdir(path) and path != str(home):
            open_to(Path(path), uid, never=never, only_inside=inside)


def _plain(path: str, workspace: str) -> None:
    """A path a run may write must be the folder or file it names, with no symlink
    on the way: a run makes symlinks in what it writes, and the daemon opens
    (ACLs), and bubblewrap binds, wherever one leads (another session's
    workspace, /etc). The workspace's own path is taken as it resolves.
    SandboxUnavailable naming the path and where it leads."""
    base = os.path.realpath(workspace)
    expected = (
        os.path.join(base, os.path.relpath(path, workspace)) if _under(path, workspace) else path
    )
    real = os.path.realpath(path)
    if real != os.path.normpath(expected):
        raise SandboxUnavailable(
            errno.ELOOP,
            f"{path} leads to {real} through a symlink: a path a run may write (its "
            "workspace, writes, writable) must be the folder or file itself. Remove the "
            "symlink (a run may have made it), or name the path it leads to",
        )


def _reachable(exe: str, workspace: str, uid: int) -> None:
    """The program a run starts must be one its uid may run: world-searchable folders
    and a world-executable file, where the sandbox does not lay the path out itself
    (the workspace, the private /tmp, the daemon's home). SandboxUnavailable naming
    the first that is not, and the two ways on."""
    home = os.path.expanduser("~")
    if not os.path.exists(exe) or any(_under(exe, f) for f in (workspace, "/tmp", home)):
        return  # (missing: the start says so itself)
    for path in [*reversed(Path(exe).parents), Path(exe)]:
        mode = os.stat(path).st_mode
        if not mode & stat.S_IXOTH:
            raise SandboxUnavailable(
                errno.EACCES,
                f"the session's uid {uid} cannot run {exe}: {path} is not "
                f"{'searchable' if path != Path(exe) else 'executable'} by others (mode "
                f"{stat.S_IMODE(mode):04o}); make it so (chmod o+x), put the program in "
                "the workspace, or name an account in the daemon's [run] user",
            )


def _exe(name: str, workspace: str) -> str:
    """The file the command starts, as the daemon finds it."""
    found = shutil.which(name, path=os.environ.get("PATH")) if "/" not in name else name
    return os.path.realpath(os.path.join(workspace, found or name))


class Boundary:
    """The daemon's sandboxes: the probe of bubblewrap, the runs' uids and homes."""

    def __init__(self, state_dir: Path) -> None:
        self.uids = DynamicUids(state_dir)
        self._lock = threading.Lock()  # plans are made in threads; the uid table is one
        self._probed: RunConfig | None = None  # the [run] table bubblewrap worked with
        self._found: dict[str, tuple[RunConfig | None, str]] = {}  # name -> (for, path)

    @staticmethod
    def on(config: DaemonConfig) -> bool:
        return config.run.sandbox == "on"

    def _find(self, name: str, what: str, package: str) -> str:
        """The program's absolute path (found once per configuration: a start pays
        no walk of PATH), or SandboxUnavailable naming the package to install."""
        found = self._found.get(name)
        if found is not None and found[0] is self._probed:
            return found[1]
        path = name if "/" in name else shutil.which(name)
        if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
            raise SandboxUnavailable(
                errno.ENOENT,
                f"runs are confined with {what} and {name!r} is not there: install "
                f"{package} (Debian: apt install {package}), {OFF_HINT}",
            )
        self._found[name] = (self._probed, os.path.abspath(path))
        return os.path.abspath(path)

    def _probe(self, config: DaemonConfig, bwrap: str) -> None:
        """bubblewrap makes its namespaces here (once per configuration)."""
        if self._probed is config.run:
            return
        argv = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-net", "--ro-bind", "/", "/"]
        argv += ["--dev", "/dev", "--proc", "/proc", "--", "/bin/sh", "-c", "exit 0"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = str(exc)
        else:
            if done.returncode == 0:
                self._probed = config.run
                return
            why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        raise SandboxUnavailable(
            errno.EPERM,
            f"bubblewrap cannot make a sandbox on this machine ({why}): the kernel must "
            "allow mount and pid namespaces (for a daemon that is not root: user "
            f"namespaces, sysctl kernel.unprivileged_userns_clone=1), {OFF_HINT}",
        )

    def plan_sync(
        self,
        config: DaemonConfig,
        spec: SessionSpec,
        session: str,
        *,
        others: Iterable[Path],
        wake_file: Path | None,
    ) -> MountPlan | None:
        """The session's plan (None: the operator turned the sandbox off); blocking."""
        if not self.on(config):
            return None
        assert spec.run is not None
        run = spec.run
        bwrap = self._find(config.run.bwrap, "bubblewrap", "bubblewrap")
        self._probe(config, bwrap)
        workspace = os.path.normpath(str(spec.workspace))
        declared = [*config.run.writable, *run.writable]
        for path in [workspace, *declared, *(_writes(workspace, run.writes) if run.writes else [])]:
            _plain(path, workspace)
        ops = self._hides(config, spec, workspace, others)
        home = config.state_dir / "homes" / session
        drop = self._identity(config, session, home)
        uid = drop[1] if drop is not None else None
        _prepare(config, spec, workspace, home, uid)
        rw = [workspace] if not run.writes else _writes(workspace, run.writes)
        if run.writes:
            ops.append((_depth(workspace), 1, "--ro-bind", workspace, workspace))
        rw += [str(home), *config.run.writable, *run.writable]
        if run.kind in AGENT_KINDS:  # the CLI's private home: its ~/.claude, ~/.codex
            agents = agent_home(config.state_dir, session)
            if uid is not None:
                own(agents, uid, deep=True)
            rw.append(str(agents))
        for path in dict.fromkeys(rw):
            option = "--bind" if path in (workspace, str(home)) else "--bind-try"
            ops.append((_depth(path), 1, option, path, path))
        ro = [*config.run.readable, *run.readable]
        if drop is not None:
            # The daemon's home (root's) is not the run's to read; the Python the
            # daemon runs on (its SDK, sessionctl) is, wherever it is installed.
            ops += _hidden_home(workspace)
            ro += runtime()
        ro += agent_cli(spec)  # where /tmp or a hidden home would hide it
        # the program and the files its command names, where the private /tmp hides them
        # (never one the boundary hides: the daemon's, another session's; nor one a
        # writable bind shows already, which a read-only bind on top would take back)
        named = [os.path.normpath(os.path.join(workspace, a)) for a in run.exec[1:]]
        hidden = [t for _, order, _, _, t in ops if order == 0]
        for path in (_exe(run.exec[0], workspace), *named):
            if (
                _under(path, "/tmp")
                and not any(_under(path, w) for w in [workspace, *rw])
                and not any(_under(path, h) for h in hidden)
                and os.path.isfile(path)
            ):
                ro.append(path)
        if wake_file is not None:
            ro.append(str(wake_file))
            if uid is not None and drop is not None:  # the run's own to read
                os.chown(wake_file, uid, drop[2])
                os.chmod(wake_file, 0o600)
        for path in dict.fromkeys(ro):
            ops.append((_depth(path), 1, "--ro-bind-try", path, path))
        endpoint = str(program_socket(config.socket))
        ops.append((_depth(endpoint), 1, "--bind", endpoint, endpoint))
        if config.model.enabled:  # the model gateway, for a run without a network
            gateway = str(gateway_socket(config.socket))
            ops.append((_depth(gateway), 1, "--bind-try", gateway, gateway))
        ops = _needed(ops)
        ops += _folders(ops)
        ops.sort(key=lambda op: (op[0], op[1]))
        env = _env({**config.profiles[run.profile].env, **run.env}, home, dropped=drop is not None)
        return MountPlan(
            bwrap=bwrap,
            cwd=str(run.cwd),
            network=run.network if run.network != "host" else config.run.network,
            mounts=tuple((o, s, t) for _, _, o, s, t in ops),
            env=env,
            drop=drop,
            home=str(home),
        )

    @staticmethod
    def _hides(
        config: DaemonConfig, spec: SessionSpec, workspace: str, others: Iterable[Path]
    ) -> list[tuple[int, int, str, str, str]]:
        """What the run must not see, as mounts (depth, order, option, source, target);
        SandboxUnavailable when the spec declares a path of the daemon's own."""
        assert spec.run is not None
        run = spec.run
        hidden = protected(config)
        for key, paths in (("writable", run.writable), ("readable", run.readable)):
            for path in paths:
                bad = next((h for h in hidden if _under(path, h)), None)
                if bad is not None:
                    raise SandboxUnavailable(
                        errno.EPERM,
                        f"run.{key}: {path!r} would show {bad}, which no run may see "
                        "(the daemon's state, socket, configuration or notices): "
                        "name another path",
                    )
        python = os.path.dirname(os.path.realpath(sys.executable))
        keep = [workspace, _exe(run.exec[0], workspace), python]
        for other in {os.path.normpath(str(p)) for p in others if os.path.isabs(p)}:
            # another session's workspace, unless it holds this one or its program
            if not any(_under(k, other) for k in keep):
                hidden.append(other)
        hidden += [*config.run.hide, *run.hide]
        ops: list[tuple[int, int, str, str, str]] = []  # depth, order, option, source, target
        for path in dict.fromkeys(hidden):
            if not os.path.lexists(path) or path == "/":
                continue
            option = "--tmpfs" if os.path.isdir(path) else "--ro-bind"
            ops.append((_depth(path), 0, option, "/dev/null", path))
        return ops

    def _identity(
        self, config: DaemonConfig, session: str, home: Path
    ) -> tuple[str, int, int] | None:
        """(setpriv, uid, gid) the run drops to, or None (the daemon is not root)."""
        if os.geteuid() != 0:
            return None
        account = config.run.identity()
        if account is None and not dynamic_uids_on(config):
            return None
        setpriv = self._find(config.run.setpriv, "their own uid through setpriv", "util-linux")
        if account is not None:
            uid, gid = account
        else:
            refused = config.access.uids() | {os.getuid()}
            with self._lock:
                uid = gid = self.uids.uid_of(session, config.run.uid_range(), refused)
        own(home, uid, deep=False)
        return setpriv, uid, gid

    async def plan(
        self,
        config: DaemonConfig,
        spec: SessionSpec,
        session: str,
        *,
        others: Iterable[Path],
        wake_file: Path | None = None,
    ) -> MountPlan | None:
        """``plan_sync`` off the event loop (it may walk a workspace, or probe)."""
        return await asyncio.to_thread(
            self.plan_sync, config, spec, session, others=list(others), wake_file=wake_file
        )


def spec_refusal(config: DaemonConfig, spec: SessionSpec) -> str | None:
    """Why this daemon refuses the spec's ``[run]`` boundary keys (None: it takes them)."""
    if spec.run is not None and spec.run.sandbox == "off" and config.run.sandbox == "on":
        return (
            'run.sandbox = "off": a spec cannot lift the boundary; only the operator '
            'can, with [run] sandbox = "off" in the daemon\'s configuration. Remove the key'
        )
    return None
