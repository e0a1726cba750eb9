"""A cgroup per run: every process a run starts is found and stopped through the
kernel, and ``[run] max_processes`` is bounded by a pids controller (docs/design.md
section 9). Standard library only.

Where the run groups go (the daemon configuration's ``[run]`` table):

- ``cgroup = "/sys/fs/cgroup/…"``: a cgroup2 folder the daemon may create children
  in. ``cgroup = "auto"`` (the default) uses the daemon's own cgroup2 group, but
  only when it is *delegated* to the daemon: systemd marks a ``Delegate=yes``
  unit's group with the ``user.delegate``/``trusted.delegate`` extended attribute,
  and a non-root daemon that owns its group counts too. Root may write every
  cgroup, so being writable alone does not make a group the daemon's; the root of
  a hierarchy is never used unasked. ``cgroup = "off"`` uses none.
- ``pids_cgroup = "/sys/fs/cgroup/pids/…"``: a folder of a cgroup v1 ``pids``
  hierarchy (hybrid machines), used where the cgroup2 folder has no pids
  controller: it bounds ``max_processes``, and with no cgroup2 folder at all it
  is also where a run's processes are found to be killed.

cgroup2's "no internal processes" rule: a group that holds processes cannot give
its children a controller. When the daemon itself lives in the folder (the usual
case under ``Delegate=yes``) and pids could be enabled for the children, the
daemon moves itself into the leaf ``<folder>/daemon`` first, as systemd asks of a
delegate; a folder that holds other processes keeps them, and then has no pids
for its run groups (killing by the group still works). Run groups are siblings
of ``daemon`` and the sweep never touches it.

How the daemon uses it (every call blocks briefly: the ones that may wait run
through ``asyncio.to_thread``):

1. At start-up, before the spawner starts (daemon/service.py): ``support =
   ctx.cgroups()[0]`` (the RunContext probes once per configuration); if it is
   not None, ``sweep(support, run_prefix(config.state_dir))`` kills and removes
   the run groups a dead daemon left — that is how a restart stops what a dead
   daemon left without a recorded pid. Before any helper process, so that the
   daemon's move into its leaf takes only itself.
2. At a start, before the program can act (runs/start.py): ``RunCgroup.create(
   support, run_prefix(state_dir) + f"{session}.{run_id}", max_processes + 1)``
   (one more for the holder); the spawn request names the group's
   ``cgroup.procs`` files and the holder joins them before its program exists
   (runs/spawner.py), so everything the program forks — double forks and
   ``setsid`` included — is born in the group. If the spawn fails, ``remove()``.
3. A stop past the grace, and the run's end (runs/program.py): ``kill()`` then
   ``remove()``. ``kill()`` returns once the group is empty.

Without a support (``detect`` returned None) runs have no cgroup and the
subreaper alone stops them; a spec that sets ``max_processes`` is then refused
(``pids_refusal`` says why).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sessiond.config import BadConfig
from sessiond.errors import SessiondError
from sessiond.runs import cgroupfs as fs
from sessiond.runs.cgroupfs import Kind

if TYPE_CHECKING:
    from sessiond.config import DaemonConfig

LEAF = "daemon"  # where the daemon moves itself inside its own delegated group
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
_FIX = "configure [run] pids_cgroup or run under systemd with Delegate=yes"


class BadCgroupConfig(BadConfig):
    """``[run] cgroup`` or ``[run] pids_cgroup`` names a folder that cannot be used."""


class CgroupError(SessiondError):
    """A run's cgroup could not be made, joined, emptied or removed."""


@dataclass(frozen=True)
class CgroupSupport:
    """What the daemon's cgroups can do for its runs."""

    cgroup2: Path | None  # the cgroup2 folder run groups are made in
    pids_v1: Path | None  # the v1 pids folder, used where cgroup2 has no pids
    pids: Kind | None  # which hierarchy bounds max_processes
    cgroup_kill: bool  # cgroup2's cgroup.kill (Linux 5.14+): one write kills a group
    pids_note: str = ""  # why there is no pids controller ("" when there is one)

    @property
    def has_pids(self) -> bool:
        return self.pids is not None

    @property
    def parents(self) -> list[tuple[Kind, Path]]:
        """Where a run group is made: cgroup2 to find and kill, the v1 pids folder
        where it bounds processes or is the only hierarchy."""
        out: list[tuple[Kind, Path]] = []
        if self.cgroup2 is not None:
            out.append(("cgroup2", self.cgroup2))
        if self.pids_v1 is not None and (self.pids == "v1" or self.cgroup2 is None):
            out.append(("v1", self.pids_v1))
        return out


def run_prefix(state_dir: Path) -> str:
    """The names of one daemon's run groups start with this: daemons that share a
    cgroup folder (one per state dir) never sweep each other's runs."""
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]
    return f"sessiond-{digest}-"


# --- detection ------------------------------------------------------------------------


def detect(config: DaemonConfig) -> CgroupSupport | None:
    """The cgroups this daemon may use for runs, or None when it has none.

    Raises BadCgroupConfig when a configured folder is missing, not a cgroup of
    the right kind, or not writable: the operator asked for it, so it is not
    silently done without.
    """
    return probe(config)[0]


def probe(config: DaemonConfig) -> tuple[CgroupSupport | None, str]:
    """``detect``, with the reason when there is no support."""
    run = config.run
    cgroup2: Path | None = None
    note = ""
    if run.cgroup == "off":
        note = '[run] cgroup is "off"'
    elif run.cgroup == "auto":
        cgroup2, note = _own_delegated_group()
    else:
        cgroup2 = _usable(Path(run.cgroup), "cgroup")
    pids_v1 = _usable(run.pids_cgroup, "pids_cgroup") if run.pids_cgroup is not None else None
    if cgroup2 is None and pids_v1 is None:
        return None, f"{note}, and no [run] pids_cgroup is set"
    pids: Kind | None = "v1" if pids_v1 is not None else None
    pids_note = ""
    if cgroup2 is not None:
        ok, why = _cgroup2_pids(cgroup2)
        if ok:
            pids = "cgroup2"
        elif pids is None:
            pids_note = f"{why}, and no [run] pids_cgroup is set"
    kill = cgroup2 is not None and fs.has_cgroup_kill(cgroup2)
    return CgroupSupport(cgroup2, pids_v1, pids, kill, pids_note), ""


def pids_refusal(support: CgroupSupport | None, note: str) -> str | None:
    """Why a spec with ``max_processes`` cannot run here (None: it can)."""
    if support is None:
        return f"max_processes needs a pids controller: {note}; {_FIX}"
    if not support.has_pids:
        return f"max_processes needs a pids controller: {support.pids_note}; {_FIX}"
    return None


def _usable(path: Path, key: str) -> Path:
    """A configured folder, checked: it exists, is a cgroup of its kind, is writable."""
    kind: Kind = "cgroup2" if key == "cgroup" else "v1"
    what = "cgroup2 folder" if kind == "cgroup2" else "folder of a cgroup v1 pids hierarchy"
    if not path.is_dir():
        raise BadCgroupConfig(
            f"[run] {key}: {path} is not a folder; create it (mkdir {path}) or point "
            f"{key} at a {what} the daemon may write"
        )
    path = path.resolve()
    if fs.mount_of(path, kind) is None or not (path / "cgroup.procs").exists():
        raise BadCgroupConfig(
            f"[run] {key}: {path} is not a {what} (see /proc/mounts for where they are)"
        )
    if not fs.writable(path):
        raise BadCgroupConfig(
            f"[run] {key}: {path} is read-only for uid {os.geteuid()} (a read-only mount, or "
            "not delegated to this user); chown it to the daemon's user or pick another folder"
        )
    return path


def _own_delegated_group() -> tuple[Path | None, str]:
    """The daemon's own cgroup2 group, if it is delegated to the daemon."""
    mount = next((m for m in fs.mounts() if m.fstype == "cgroup2"), None)
    if mount is None:
        return None, "the machine has no cgroup2 file system"
    own = fs.group_of(os.getpid(), mount)
    if own is None:
        return None, "the daemon's cgroup2 group is outside the mounted hierarchy"
    if own.name == LEAF and fs.delegated(own.parent):
        own = own.parent  # detected before: the daemon moved itself into its leaf
    if own == mount.point:
        return None, (
            f"the daemon's own cgroup2 group is the root of {mount.point}, which is not "
            "delegated to it (set [run] cgroup to a folder it may use)"
        )
    if not fs.delegated(own):
        return None, (
            f"the daemon's own cgroup2 group {own} is not delegated to it "
            "(systemd's Delegate=yes marks it with the user.delegate attribute)"
        )
    if not fs.writable(own):
        return None, f"the daemon's own cgroup2 group {own} is not writable"
    return own, ""


def _cgroup2_pids(folder: Path) -> tuple[bool, str]:
    """Whether run groups made in ``folder`` get a pids controller; enables it in the
    folder's cgroup.subtree_control (the daemon's own folder) when it can."""
    if "pids" in fs.words(folder / "cgroup.subtree_control"):
        return True, ""
    controllers = fs.words(folder / "cgroup.controllers")
    if "pids" not in controllers:
        return False, (
            f"the cgroup2 folder {folder} has no pids controller (its cgroup.controllers: "
            f"{' '.join(controllers) or 'none'})"
        )
    mount = fs.mount_of(folder, "cgroup2")
    if mount is not None and not (mount.point == folder and mount.root == "/"):
        # Not a hierarchy's root (the one group that may mix processes and children).
        others = [p for p in fs.words(folder / "cgroup.procs") if p != str(os.getpid())]
        if others:
            return False, (
                f"the cgroup2 folder {folder} holds processes ({', '.join(others[:5])}), and "
                "a cgroup2 group with processes cannot give its children a controller"
            )
        if fs.group_of(os.getpid(), mount) == folder:
            _leave_for_leaf(folder)
    try:
        _enable_pids(folder)
    except CgroupError as exc:
        return False, str(exc)
    return True, ""


def _leave_for_leaf(folder: Path) -> None:
    """The daemon lives in ``folder`` itself: it moves into ``folder/daemon``, so
    that the folder may give its run groups a controller."""
    leaf = folder / LEAF
    with contextlib.suppress(OSError):
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))


def _enable_pids(folder: Path) -> None:
    try:
        (folder / "cgroup.subtree_control").write_text("+pids")
    except OSError as exc:
        held = fs.words(folder / "cgroup.procs")
        why = (
            f"it holds processes ({', '.join(held[:5])}), and a cgroup2 group with "
            "processes cannot give its children a controller"
            if held
            else exc.strerror
        )
        raise CgroupError(f"cannot enable pids in the cgroup2 folder {folder}: {why}") from exc


# --- a run's group ----------------------------------------------------------------------


@dataclass
class RunCgroup:
    """One run's group, in each hierarchy the daemon uses."""

    name: str
    groups: list[tuple[Kind, Path]]  # the run's group in each hierarchy
    cgroup_kill: bool  # kill through the cgroup2 group's cgroup.kill
    max_processes: int | None = None

    @property
    def folders(self) -> list[Path]:
        return [group for _, group in self.groups]

    @classmethod
    def create(cls, support: CgroupSupport, name: str, max_processes: int | None) -> RunCgroup:
        """Make the run's group (empty) and set its ``pids.max``.

        Raises CgroupError when the name is taken (a leftover: sweep first), the
        limit needs a pids controller there is not, or the kernel refuses.
        """
        if not _NAME_RE.fullmatch(name) or name == LEAF:
            raise ValueError(f"{name!r} is not a usable cgroup name")
        if max_processes is not None:
            if max_processes < 1:
                raise ValueError("max_processes must be at least 1")
            if support.pids is None:
                raise CgroupError(f"max_processes needs a pids controller: {support.pids_note}")
        made: list[tuple[Kind, Path]] = []
        try:
            for kind, parent in support.parents:
                bounds = max_processes is not None and kind == support.pids
                enabled = fs.words(parent / "cgroup.subtree_control")
                if bounds and kind == "cgroup2" and "pids" not in enabled:
                    _enable_pids(parent)
                group = parent / name
                try:
                    group.mkdir()
                except FileExistsError:
                    raise CgroupError(
                        f"the cgroup {group} exists already (a run's leftover: sweep it first)"
                    ) from None
                made.append((kind, group))
                if bounds:
                    (group / "pids.max").write_text(str(max_processes))
        except (OSError, CgroupError) as exc:
            for _, group in reversed(made):
                with contextlib.suppress(OSError):
                    group.rmdir()
            if isinstance(exc, CgroupError):
                raise
            raise CgroupError(f"cannot make the run cgroup {name}: {exc}") from exc
        return cls(name, made, _kills(support, made), max_processes)

    @classmethod
    def existing(cls, support: CgroupSupport, name: str) -> RunCgroup:
        """A run's group that is already there (in whichever hierarchies it is)."""
        groups: list[tuple[Kind, Path]] = []
        if support.cgroup2 is not None and (support.cgroup2 / name).is_dir():
            groups.append(("cgroup2", support.cgroup2 / name))
        if support.pids_v1 is not None and (support.pids_v1 / name).is_dir():
            groups.append(("v1", support.pids_v1 / name))
        return cls(name, groups, _kills(support, groups))

    def attach(self, pid: int) -> None:
        """Move ``pid`` (a held holder, before it runs the program) into the group of
        each hierarchy; its children are born there."""
        for _, group in self.groups:
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                raise CgroupError(f"cannot move pid {pid} into {group}: {exc}") from exc

    def procs(self) -> list[int]:
        """Every process in the run's groups (and in groups the program made below them)."""
        found: set[int] = set()
        for _, group in self.groups:
            for folder, _, _ in os.walk(group):
                found.update(int(p) for p in fs.words(Path(folder) / "cgroup.procs"))
        return sorted(found)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL every process of the run and return once the groups are empty.

        cgroup2's cgroup.kill kills the group at once, forks in flight included.
        Elsewhere (v1, old kernels) every listed process is killed until the list
        stays empty: a process killed while it forks leaves no child, and a child
        born before the kill is listed on the next read. No freezer is needed.
        Raises CgroupError if processes remain after ``timeout`` seconds (stuck in
        the kernel, say).
        """
        deadline = time.monotonic() + timeout
        members = self._members()
        while True:
            if self.cgroup_kill:
                with contextlib.suppress(FileNotFoundError):
                    (self.groups[0][1] / "cgroup.kill").write_text("1")
            pids = self.procs()
            if not pids:
                return
            fds = [fd for pid in pids if (fd := fs.kill_member(pid, members)) is not None]
            try:
                fs.wait_exited(fds, deadline)
            finally:
                for fd in fds:
                    os.close(fd)
            if time.monotonic() > deadline and (left := self.procs()):
                raise CgroupError(
                    f"the run cgroup {self.name} still has processes after {timeout:g}s: "
                    f"{', '.join(map(str, left[:10]))}"
                )

    def _members(self) -> list[tuple[str, str]]:
        """How /proc/PID/cgroup names the run's groups: (controller, path) per
        hierarchy, the controller "" for cgroup2."""
        out = []
        for kind, group in self.groups:
            mount = fs.mount_of(group, kind)
            if mount is not None:
                rel = mount.root.rstrip("/") + "/" + str(group.relative_to(mount.point))
                out.append(("" if kind == "cgroup2" else "pids", rel))
        return out

    def remove(self) -> None:
        """Remove the run's groups (those the program made below them first); one
        that is gone already is fine. Raises CgroupError if processes remain."""
        for _, group in self.groups:
            for folder, _, _ in os.walk(group, topdown=False):
                try:
                    os.rmdir(folder)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno == errno.EBUSY:
                        held = ", ".join(fs.words(Path(folder) / "cgroup.procs")[:10])
                        raise CgroupError(
                            f"cannot remove {folder}: it still has processes ({held}); kill() first"
                        ) from exc
                    raise CgroupError(f"cannot remove {folder}: {exc}") from exc


def _kills(support: CgroupSupport, groups: list[tuple[Kind, Path]]) -> bool:
    """cgroup.kill is used when the first group is the run's cgroup2 one."""
    return support.cgroup_kill and bool(groups) and groups[0][0] == "cgroup2"


def sweep(support: CgroupSupport, prefix: str) -> list[str]:
    """Kill and remove the run groups whose names start with ``prefix`` (what a dead
    daemon left); returns their names. Never touches the daemon's own leaf, nor a
    group the calling process is in."""
    if not prefix or "/" in prefix:
        raise ValueError("sweep needs a name prefix (run_prefix(state_dir))")
    names: set[str] = set()
    for parent in (support.cgroup2, support.pids_v1):
        if parent is None:
            continue
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(parent):
                if entry.name.startswith(prefix) and entry.name != LEAF and entry.is_dir():
                    names.add(entry.name)
    swept = []
    for name in sorted(names):
        cg = RunCgroup.existing(support, name)
        if os.getpid() in cg.procs():
            continue
        cg.kill()
        cg.remove()
        swept.append(name)
    return swept
