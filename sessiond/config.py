"""The daemon's configuration (``config/sessiond.toml`` documents every key).

Settings come from ``--config`` / ``SESSIOND_CONFIG`` (a TOML file), then
``SESSIOND_STATE_DIR`` and ``SESSIOND_SOCKET``, then the command-line flags,
each overriding the one before. Relative paths in the file are taken from the
file's folder. A bad key or value stops start-up with a message naming the
file, the key and what is allowed.
"""

from __future__ import annotations

import grp
import math
import os
import pwd
import re
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sessiond.durations import MAX_DURATION, Duration, format_duration
from sessiond.errors import InvalidInput
from sessiond.modelconfig import ModelConfig
from sessiond.paths import default_socket, default_state_dir
from sessiond.sandboxconfig import DaemonSandboxKeys
from sessiond.webconfig import WebConfig


class BadConfig(InvalidInput):
    """The daemon configuration is not valid; the message names the file and the key."""

    code = "bad_config"


class _Strict(BaseModel):
    # allow_inf_nan: no number in the configuration may be NaN or infinite (TOML can
    # write both); the keys that take floats also say so in their own words
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class AccessConfig(_Strict):
    """Who besides the daemon's own user and root may use the socket."""

    users: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)

    @field_validator("users")
    @classmethod
    def _known_users(cls, users: list[str]) -> list[str]:
        for user in users:
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise ValueError(f"there is no user {user!r} on this machine") from None
        return users

    @field_validator("groups")
    @classmethod
    def _known_groups(cls, groups: list[str]) -> list[str]:
        for group in groups:
            try:
                grp.getgrnam(group)
            except KeyError:
                raise ValueError(f"there is no group {group!r} on this machine") from None
        return groups

    def uids(self) -> set[int]:
        return {pwd.getpwnam(u).pw_uid for u in self.users}

    def gids(self) -> set[int]:
        return {grp.getgrnam(g).gr_gid for g in self.groups}


class ProfileBudget(_Strict):
    """What a profile changes of a spec's ``[budget]``: each key set here replaces
    the spec's (0 means no limit, as there); a key left out keeps the spec's."""

    runs_per_day: int | None = Field(default=None, ge=0)
    seconds_per_run: int | None = Field(default=None, ge=0)
    tokens: int | None = Field(default=None, ge=0)
    tool_calls_per_run: int | None = Field(default=None, ge=0)


class AgentBudget(_Strict):
    """An agent's budget over all its sessions (those whose spec names it as
    ``agent``), enforced by the model gateway at each call; 0 means no limit.
    A day is a UTC day."""

    tokens_per_day: int = Field(default=0, ge=0)
    cost_usd_per_day: float = Field(default=0.0, ge=0, allow_inf_nan=False)


class AgentConfig(_Strict):
    """``[agents.NAME]``: what the daemon knows of an agent (a spec's ``agent``)."""

    budget: AgentBudget = Field(default_factory=AgentBudget)


class ProfileConfig(_Strict):
    """A runner profile: what a session's program runs with (e.g. which model).

    A session runs with its profile: the spec's ``run.profile`` when it was
    created, then whatever ``sessionctl migrate NAME --profile P`` chose (recorded
    as ``session.migrated``). Each run's program gets ``model`` as
    ``SESSIOND_MODEL`` and the profile's name as ``SESSIOND_PROFILE``; ``env`` is
    added to its environment (under the spec's own ``run.env``); ``exec``, if set,
    runs instead of the spec's ``run.exec``; ``budget`` replaces the keys it sets.
    """

    model: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    exec: list[str] | None = Field(default=None, min_length=1)
    budget: ProfileBudget = Field(default_factory=ProfileBudget)

    @field_validator("env")
    @classmethod
    def _no_reserved_env(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in env if k.startswith("SESSIOND_"))
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: SESSIOND_* variables are set by the daemon for the "
                "program (the model is SESSIOND_MODEL, from 'model'); use another name"
            )
        return env


class RunConfig(_Strict, DaemonSandboxKeys):
    """Where runs' processes are grouped (docs/design.md section 9; sessiond.runs.cgroups)
    and how they are confined (sessiond.sandboxconfig, sessiond.runs.sandbox).

    ``cgroup``: ``"auto"`` uses the daemon's own cgroup2 group when it is delegated
    to it (systemd ``Delegate=yes``), ``"off"`` uses none, and an absolute path names
    a cgroup2 folder the daemon may create run groups in. ``pids_cgroup``: a folder
    of a cgroup v1 ``pids`` hierarchy, used to bound ``max_processes`` where the
    cgroup2 folder has no pids controller.
    """

    cgroup: str = "auto"
    pids_cgroup: Path | None = None
    # Programs run as this user and group (where the daemon runs as root): the real
    # boundary between a program and the daemon (docs/design.md section 8). No process
    # of this uid is an operator on the control socket. group: the user's own.
    user: str | None = None
    group: str | None = None

    @field_validator("user")
    @classmethod
    def _known_user(cls, user: str | None) -> str | None:
        if user is not None:
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                raise ValueError(f"there is no user {user!r} on this machine") from None
            if entry.pw_uid == 0:
                raise ValueError("programs may not run as root: name an unprivileged user")
            if os.geteuid() != 0:
                raise ValueError(
                    f"the daemon runs as uid {os.geteuid()}, not root, so it cannot start "
                    f"programs as {user!r}: run the daemon as root (a system service), or "
                    "remove [run] user"
                )
        return user

    @field_validator("group")
    @classmethod
    def _known_group(cls, group: str | None) -> str | None:
        if group is not None:
            try:
                grp.getgrnam(group)
            except KeyError:
                raise ValueError(f"there is no group {group!r} on this machine") from None
        return group

    @model_validator(mode="after")
    def _group_needs_user(self) -> RunConfig:
        if self.group is not None and self.user is None:
            raise ValueError("[run] group needs [run] user: name the user programs run as")
        return self

    def identity(self) -> tuple[int, int] | None:
        """(uid, gid) programs run as, or None: the daemon's own."""
        if self.user is None:
            return None
        entry = pwd.getpwnam(self.user)
        gid = grp.getgrnam(self.group).gr_gid if self.group is not None else entry.pw_gid
        return entry.pw_uid, gid

    @field_validator("cgroup")
    @classmethod
    def _cgroup(cls, value: str) -> str:
        if value not in ("auto", "off") and not Path(value).is_absolute():
            raise ValueError(
                f'{value!r}: use "auto", "off" or an absolute path to a cgroup2 folder '
                '(e.g. "/sys/fs/cgroup/sessiond")'
            )
        return value

    @field_validator("pids_cgroup")
    @classmethod
    def _pids_cgroup(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(
                f"{str(value)!r}: use an absolute path to a folder of the cgroup v1 pids "
                'hierarchy (e.g. "/sys/fs/cgroup/pids/sessiond")'
            )
        return value


# What a [[notify]] entry may ask for, besides any event type of the log (e.g.
# "tool.finished"): sessiond.notify.notices says which records are which.
NOTICE_EVENTS = (
    "approval.requested",
    "approval.granted",
    "approval.denied",
    "blocked",
    "run.failed",
    "budget.exhausted",
    "completed",
    "failed",
    "terminated",
    "message.received",
)
DEFAULT_NOTICES = ("approval.requested", "blocked", "run.failed", "budget.exhausted")


class NotifyConfig(_Strict):
    """One ``[[notify]]`` target: an Apprise URL and the events it wants (docs/design.md 11)."""

    url: str = Field(min_length=4)
    events: list[str] = Field(default_factory=lambda: list(DEFAULT_NOTICES), min_length=1)
    # names the target in `sessionctl notify` and keys its cursor (default: the URL's hash)
    name: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    retry_min: Duration = 1.0
    retry_max: Duration = 300.0
    # approval notices carry signed one-shot approve / deny links to the web
    # console's confirm page (docs/web.md); they expire link_ttl after the request
    # (default: the session's policy.approval_ttl)
    links: bool = False
    link_ttl: Duration | None = None

    @field_validator("events")
    @classmethod
    def _known_events(cls, events: list[str]) -> list[str]:
        # event types of the log are checked against the log's own list at start-up
        for event in events:
            if event not in NOTICE_EVENTS and not re.fullmatch(r"[a-z]+\.[a-z_]+", event):
                raise ValueError(
                    f"{event!r} is not an event: use {', '.join(NOTICE_EVENTS)}, "
                    "or an event type of the log (docs/events.md)"
                )
        return events

    @field_validator("url")
    @classmethod
    def _has_scheme(cls, url: str) -> str:
        if "://" not in url:
            raise ValueError(
                f"{url!r} is not an Apprise URL: write scheme://…, e.g. "
                "'ntfy://ntfy.sh/my-topic' or 'json://127.0.0.1:8080/hook'"
            )
        return url


class OtelConfig(_Strict):
    """``[otel]``: export the spans derived from the log (sessiond.otel) over OTLP/HTTP."""

    endpoint: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    service_name: str = "sessiond"
    headers: dict[str, str] = Field(default_factory=dict)


class RetentionConfig(_Strict):
    """What a gc removes ([retention]; docs/design.md section 6; sessiond.syscalls.retention).

    Nothing is removed by itself: every rule is off until set, and a gc runs only
    on ``sessionctl gc`` or every ``interval``. Events are never removed, nor what
    continuing a live session needs (the resume gate's artifacts, its open turn's
    step results, what its messages view shows) nor the newest snapshot.
    """

    # artifacts of sessions terminated at least this long ago (by the daemon's clock)
    terminated: Duration | None = None
    # artifacts no event names (a crash between storing one and recording it), once
    # their file is at least this old
    unreferenced: Duration | None = None
    # of the artifacts a session's events name, keep the newest N (by the event that
    # last named them); older ones go
    keep_artifacts: int | None = Field(default=None, ge=0)
    # snapshots kept per session, newest first
    snapshots: int | None = Field(default=None, ge=1)
    # run a gc this often in the daemon (unset: only on `sessionctl gc`)
    interval: Duration | None = None
    # TEST ONLY (the crash tests): the daemon kills itself (SIGKILL) in a gc once it
    # has removed this many files. Never set it in production.
    fault_kill_after: int | None = Field(default=None, ge=0)

    @field_validator("interval")
    @classmethod
    def _sane_interval(cls, value: float | None) -> float | None:
        if value is not None and value < 1:
            raise ValueError("interval must be at least 1s (e.g. '1h', '1d')")
        return value

    def rules(self) -> list[str]:
        """The rules set, as ``key = value`` (empty: a gc removes nothing)."""
        out = [
            f"{k} = {format_duration(v) if v else '0s'}"
            for k in ("terminated", "unreferenced")
            if (v := getattr(self, k)) is not None
        ]
        out += [
            f"{k} = {v}"
            for k in ("keep_artifacts", "snapshots")
            if (v := getattr(self, k)) is not None
        ]
        return out


class ClusterConfig(_Strict):
    """``[cluster]``: several daemons (nodes) sharing one PostgreSQL (docs/design.md
    section 10). Without ``dsn`` the daemon keeps its sessions in plain files."""

    dsn: str | None = None
    node: str = Field(default_factory=lambda: socket.gethostname()[:64] or "node")
    lease_ttl: Duration = 10.0
    # false behind PgBouncer in transaction mode (it cannot keep prepared statements)
    prepared: bool = True
    # what this node advertises; a spec's node_labels must all be among them
    labels: dict[str, str] = Field(default_factory=dict)
    # folders every node mounts at the same path: a session whose workspace lies
    # under one may fail over; any other workspace belongs to its node
    shared_paths: list[Path] = Field(default_factory=list)
    # placement by load (cluster/balance.py): how often a node says its load and
    # compares it with the others', and how many sessions it hands over per
    # interval to even it out (0: none, and a new session stays where it is made)
    placement_interval: Duration = 2.0
    moves_per_interval: int = Field(default=10, ge=0, le=10_000)

    @field_validator("placement_interval")
    @classmethod
    def _sane_interval(cls, value: float) -> float:
        if not 0.1 <= value <= 600:
            raise ValueError("placement_interval must be between 0.1s and 10m (e.g. '2s')")
        return value

    @field_validator("shared_paths")
    @classmethod
    def _absolute_paths(cls, paths: list[Path]) -> list[Path]:
        for path in paths:
            if not path.is_absolute():
                raise ValueError(f"{path} is not an absolute path (e.g. '/srv/shared')")
        return paths

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
            raise ValueError(
                "node must be 1-64 letters, digits, '.', '_' or '-' (e.g. the host name)"
            )
        return value

    @field_validator("lease_ttl")
    @classmethod
    def _sane_ttl(cls, value: float) -> float:
        if not 1.0 <= value <= 600:
            raise ValueError("lease_ttl must be between 1s and 10m (e.g. '10s')")
        return value


class DaemonConfig(_Strict):
    state_dir: Path = Field(default_factory=default_state_dir)
    socket: Path = Field(default_factory=default_socket)
    specs: Path | None = None
    durability: Literal["fsync", "os"] = "fsync"
    # durability "os": each log is synced at least this often (what a power cut may lose)
    sync_interval: Duration = 1.0
    snapshot_every: int = Field(default=1000, ge=10)
    shutdown_grace: Duration = 10.0
    stop_grace: Duration = 5.0
    max_frame_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    read_timeout: Duration = 300.0
    max_connections: int = Field(default=4096, ge=1)
    # New events a `log --follow` reader may have outstanding before the daemon ends its
    # stream with fell_behind (sessionctl then catches up from the log by itself).
    follow_buffer: int = Field(default=10_000, ge=1, le=10_000_000)
    max_output_bytes: int = Field(default=16 << 20, ge=1024)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access: AccessConfig = Field(default_factory=AccessConfig)
    profiles: dict[str, ProfileConfig] = Field(default_factory=lambda: {"default": ProfileConfig()})
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    run: RunConfig = Field(default_factory=RunConfig)
    notify: list[NotifyConfig] = Field(default_factory=list)
    web: WebConfig = Field(default_factory=WebConfig)
    otel: OtelConfig = Field(default_factory=OtelConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)  # the model gateway
    # TEST ONLY: the daemon kills itself (SIGKILL) when a run reaches this point;
    # the crash tests use it to stop at exact places. Never set it in production.
    fault: (
        Literal[
            "before-intent",
            "after-intent",
            "after-policy",
            "after-started",
            "after-spawn",
            "after-record",
            "during-work",
            "after-finished",
            "after-observation",
            "after-run-finished",
            # an SDK step's end written, not yet durable nor answered
            "step-end-written",
            # an SDK step answered ``run``, before anything more is done
            "step-run-answered",
            # the hand-over (migrate --to), at the source: after migration.started;
            # after the target holds its copy arriving; after the commit
            "migrate-after-started",
            "migrate-after-prepare",
            "migrate-after-commit",
            # at the target: its arriving copy is durable, not answered yet; the
            # finish asked, not recorded; the finish recorded, not answered
            "arrive-after-prepare",
            "arrive-before-finish",
            "arrive-after-finish",
        ]
        | None
    ) = None
    # TEST ONLY: the daemon's clock runs this many seconds ahead of the machine's (it
    # stamps events and drives cron/every); the tests use it to "be" next month.
    clock_offset: float = 0.0
    # TEST ONLY (the fault tests, see sessiond/daemon/faults.py): while this file exists,
    # every write to a session log fails with ENOSPC, as on a full disk.
    fault_full_disk: Path | None = None
    # TEST ONLY: the start-up probe of the state dir fails with this error, as on a
    # read-only mount or a folder the daemon may not write (root ignores modes).
    fault_state_dir: Literal["EROFS", "EACCES"] | None = None
    # TEST ONLY: after each durable point of a log, append "session offset" to this
    # file; the power-cut simulation cuts every log back to its last recorded offset.
    record_synced: Path | None = None
    # TEST ONLY (the race tests): a run's start waits at this point until the file
    # ``fault_hold_until`` exists, so a test can act while a start is under way:
    # "before-spawn" (the gate said ok, the program is not started yet) or
    # "after-spawn" (the program runs, the daemon does not supervise it yet);
    # "open-rest" (a start-up from the table index serves, the sessions without
    # work in flight are not opened yet, the start-up is not done); "open-late"
    # (the start-up is done, ``daemon.ready``, the sessions it did not need are not
    # opened yet); "open-midway" (the same load after half of those sessions are
    # opened); "serve" (the early server alone serves, the full server has not
    # taken the socket over yet); "watch-arm" (a file watcher is about to be built:
    # the request that armed it is answered, its inotify watches are not in place).
    fault_hold: (
        Literal[
            "before-spawn",
            "after-spawn",
            "open-rest",
            "open-late",
            "open-midway",
            "serve",
            "watch-arm",
        ]
        | None
    ) = None
    fault_hold_until: Path | None = None
    watch_step_ms: int = Field(default=15, ge=5, le=10_000)
    max_running: int = Field(default=0, ge=0)
    max_running_per_agent: int = Field(default=0, ge=0)
    aging: Duration = 60.0

    @field_validator("sync_interval")
    @classmethod
    def _sane_sync_interval(cls, value: float) -> float:
        if not 0.001 <= value <= 3600:
            raise ValueError("sync_interval must be between 1ms and 1h (e.g. '1s', '200ms')")
        return value

    @field_validator("aging")
    @classmethod
    def _positive_aging(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("aging must be more than 0 seconds")
        return value

    @field_validator("clock_offset", mode="before")
    @classmethod
    def _finite_offset(cls, value: object) -> object:
        # (the bound first: an integer too large for a float overflows isfinite)
        if isinstance(value, int | float) and not (
            abs(value) <= MAX_DURATION and math.isfinite(value)
        ):
            raise ValueError(
                f"{value!r} is not a clock offset: write a number of seconds within "
                "100 years, e.g. 0 or 86400"
            )
        return value

    @field_validator("state_dir", "socket")
    @classmethod
    def _absolute(cls, path: Path) -> Path:
        # Absolute from the daemon's working folder, once, here: the daemon hands the
        # socket (SESSIOND_SOCKET) and files under the state dir (SESSIOND_WAKE_FILE)
        # to programs that run in their own workspace, where a relative path would
        # name another place. Not resolved: a symlinked folder stays as written.
        return Path(os.path.abspath(path))

    source: Path | None = None  # the file read, for messages; not a key

    @model_validator(mode="after")
    def _hold_has_file(self) -> DaemonConfig:
        if (self.fault_hold is None) != (self.fault_hold_until is None):
            raise ValueError("fault_hold and fault_hold_until go together: set both or neither")
        return self

    @field_validator("profiles")
    @classmethod
    def _has_default(cls, profiles: dict[str, ProfileConfig]) -> dict[str, ProfileConfig]:
        if "default" not in profiles:
            return {"default": ProfileConfig(), **profiles}
        return profiles


def load_config(
    path: Path | None,
    *,
    env: dict[str, str],
    state_dir: Path | None = None,
    socket: Path | None = None,
) -> DaemonConfig:
    """Read the file (if any), then apply the environment and the flags."""
    # the TOML file as parsed, then the environment's and flags' overrides: DaemonConfig checks it
    data: dict[str, Any] = {}
    path = path or (Path(env["SESSIOND_CONFIG"]) if env.get("SESSIOND_CONFIG") else None)
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise BadConfig(f"cannot read configuration {path}: {exc.strerror}") from exc
        except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, too many digits
            raise BadConfig(f"{path}: not valid TOML: {exc}") from exc
        if "source" in data:
            raise BadConfig(f"{path}: source: unknown key")
        base = path.parent.resolve()
        for key in ("state_dir", "socket", "specs"):
            if isinstance(data.get(key), str):
                data[key] = base / data[key]
        web = data.get("web")
        if isinstance(web, dict):
            for key in ("tls_cert", "tls_key"):
                if isinstance(web.get(key), str):
                    web[key] = base / web[key]
        model = data.get("model")
        for provider in model.get("provider", []) if isinstance(model, dict) else []:
            if isinstance(provider, dict) and isinstance(provider.get("key_file"), str):
                provider["key_file"] = base / provider["key_file"]
        data["source"] = path.resolve()
    if env.get("SESSIOND_STATE_DIR"):
        data["state_dir"] = Path(env["SESSIOND_STATE_DIR"])
    if env.get("SESSIOND_SOCKET"):
        data["socket"] = Path(env["SESSIOND_SOCKET"])
    if state_dir is not None:
        data["state_dir"] = state_dir
    if socket is not None:
        data["socket"] = socket
    try:
        return DaemonConfig.model_validate(data)
    except ValidationError as exc:
        where = str(path) if path else "configuration"
        problems = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                problems.append(f"{loc}: unknown key (see config/sessiond.toml for every key)")
            else:
                message = str(e["msg"]).removeprefix("Value error, ")
                given = e.get("input")
                if (
                    isinstance(given, str | int | float)
                    and len(repr(given)) < 80
                    and repr(given) not in message
                ):
                    message += f" (got {given!r})"
                problems.append(f"{loc}: {message}")
        raise BadConfig(f"{where}: " + "; ".join(problems)) from exc
