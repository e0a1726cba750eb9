"""Session specs: one TOML file a session (docs/design.md section 7).

Every key is documented in ``docs/spec.md``; unknown keys are refused, and every refusal
names the file, the key and what is allowed.
Paths: ``run.cwd`` (the workspace), a git trigger's ``repo`` and relative
``compact.exec``/``run.exec`` programs are taken from the spec file's folder.
Paths *inside* the workspace — ``run.writes``, ``bind.files``, a watch
trigger's ``paths``/``exclude`` and a git trigger's ``paths`` — are relative to
the workspace and may not leave it; one written absolute that lies inside the
workspace is stored relative to it (docs/design.md section 7).
"""

from __future__ import annotations

import os
import re
import tomllib
import zoneinfo
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sessiond.config import ProfileConfig
from sessiond.durations import Duration
from sessiond.errors import InvalidInput
from sessiond.log.event_data import Idempotency, ResumeRule, SideEffect
from sessiond.modelconfig import ModelSpec
from sessiond.names import NAME_RE
from sessiond.sandboxconfig import SandboxKeys
from sessiond.table.agent_spec import ClaudeCodeSpec, CodexSpec, check_agent_tables, driver_argv
from sessiond.table.budget_spec import BudgetSpec
from sessiond.table.compact_spec import CompactSpec
from sessiond.table.specints import huge_at

MAX_SPEC_BYTES = 1 << 20
TomlTable = dict[str, Any]  # a table of spec.toml as parsed, any TOML in it: the models check it

# What ``[run] grants`` may give a session's program on the program endpoint
# (docs/design.md section 8, "Who may approve"), and the default. The operator's
# methods (approve, deny, resolve, reload, apply, migrate, export, import) are
# never among them: a person answers, not a program.
GRANTABLE = frozenset(
    {
        "ps", "show", "log", "replay", "gate", "send", "fork", "merge", "create",
        "activate", "suspend", "resume", "interrupt", "cancel", "compact",
    }
)  # fmt: skip
DEFAULT_GRANTS = ("ps", "show", "log", "send")


class BadSpec(InvalidInput):
    """A session spec is not valid TOML or breaks a rule; the message names the key."""

    code = "bad_spec"


class _Strict(BaseModel):
    # allow_inf_nan: no number in a spec may be NaN or infinite (TOML can write both);
    # durations refuse them in their own words (sessiond/durations.py)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _inside(value: str, key: str, info: ValidationInfo) -> str:
    """A workspace-relative path or glob that stays inside the workspace; an absolute
    one inside the workspace comes back relative to it.

    The workspaces, as ``parse_spec`` passes them in the validation context: run.cwd
    resolved, and as written (made absolute but not resolved), so that a path under
    either spelling of a symlinked folder counts as inside."""
    path = PurePosixPath(value)
    workspaces: list[str] = (info.context or {}).get("workspaces", [])
    if path.is_absolute():
        plain = PurePosixPath(os.path.normpath(value))  # '..' taken out as text
        for workspace in workspaces:
            if plain.is_relative_to(workspace):
                return str(plain.relative_to(workspace))
        where = f" {workspaces[0]}" if workspaces else ""
        raise ValueError(
            f"{value!r} is outside the workspace{where}: {key} paths must lie inside it; "
            f"write them relative to run.cwd or as an absolute path under it"
        )
    if not value or ".." in path.parts:
        raise ValueError(
            f"{value!r} must be a path inside the workspace: relative, without '..' "
            f"({key} paths are taken from run.cwd)"
        )
    return value


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SecretRef(_Strict):
    """Where a secret's value is, never the value: a variable of the daemon's
    environment, or a file (absolute once parsed). Read when a program starts
    (sessiond.runs.secrets); the spec, and so every copy of it, holds only this."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError(
                'a secret is either { env = "VARIABLE" } (a variable of the daemon\'s '
                'environment) or { file = "/path" }: give exactly one'
            )
        if self.env is not None and not ENV_NAME.fullmatch(self.env):
            raise ValueError(f"env {self.env!r} is not an environment variable name")
        if self.file is not None and not self.file:
            raise ValueError("file must be a path")
        return self


class RunSpec(_Strict, SandboxKeys):  # sandbox, network, writable, readable, hide
    # "claude-code" / "codex": an agent CLI headless, see [claude_code] / [codex]
    kind: Literal["command", "sdk", "claude-code", "codex"] = "command"
    exec: list[str] = Field(min_length=1)
    cwd: str = "."
    # Stored with the spec (session.created, spec.toml, bundles): never a secret here.
    env: dict[str, str] = Field(default_factory=dict)
    # name in the program's environment -> where its value is; values never stored
    secrets: dict[str, SecretRef] = Field(default_factory=dict)
    timeout: Duration = 600.0
    profile: str = "default"
    side_effect: SideEffect = "workspace-write"
    idempotency: Idempotency = "conditional"
    resume: ResumeRule = "rerun-after-check"
    writes: list[str] = Field(default_factory=list)
    retries: int = Field(default=3, ge=0, le=100)
    # Processes the run may have at once (a pids controller bounds it: see
    # sessiond.runs.cgroups); None: no bound. RLIMIT_NPROC cannot stand in: it
    # counts per uid, and root ignores it. At most the kernel's PID_MAX_LIMIT.
    max_processes: int | None = Field(default=None, ge=1, le=4_194_304)
    # The methods its program may call on the program endpoint besides ping and sdk.*
    grants: list[str] = Field(default_factory=lambda: list(DEFAULT_GRANTS))

    @model_validator(mode="before")
    @classmethod
    def _driver(cls, data: object) -> object:
        # An agent CLI run's program is sessiond's driver of the CLI.
        argv = driver_argv(data.get("kind")) if isinstance(data, dict) else None
        if isinstance(data, dict) and "exec" not in data and argv is not None:
            return {**data, "exec": argv}
        return data

    @field_validator("grants")
    @classmethod
    def _grantable(cls, grants: list[str]) -> list[str]:
        bad = [g for g in grants if g not in GRANTABLE]
        if bad:
            raise ValueError(
                f"{', '.join(repr(g) for g in bad)}: not a method a program may be granted; "
                f"choose from {', '.join(sorted(GRANTABLE))} (approve, deny, resolve, reload, "
                "apply, migrate, export and import are a person's, never a program's)"
            )
        return list(dict.fromkeys(grants))

    @field_validator("env")
    @classmethod
    def _no_reserved_env(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in env if k.startswith("SESSIOND_"))
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: SESSIOND_* variables are set by the daemon for the "
                "program; use another name"
            )
        return env

    @field_validator("secrets", mode="before")
    @classmethod
    def _by_reference(cls, secrets: object) -> object:
        if isinstance(secrets, dict):
            for name, ref in secrets.items():
                if not isinstance(ref, dict):
                    raise ValueError(
                        f"{name}: a secret is named by reference, never written in the spec: "
                        '{ env = "VARIABLE" } or { file = "/path" }'
                    )
        return secrets

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, secrets: dict[str, SecretRef]) -> dict[str, SecretRef]:
        for name in secrets:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name.startswith("SESSIOND_"):
                raise ValueError(
                    f"{name}: SESSIOND_* variables are set by the daemon for the program; "
                    "use another name"
                )
        return secrets

    @model_validator(mode="after")
    def _env_or_secret(self) -> RunSpec:
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(
                f"{', '.join(both)}: named in both env and secrets; a variable is one or the "
                "other (a secret belongs in secrets only: env is stored)"
            )
        return self

    @field_validator("writes")
    @classmethod
    def _writes_inside(cls, writes: list[str], info: ValidationInfo) -> list[str]:
        return [_inside(w, "run.writes", info) for w in writes]

    @field_validator("timeout")
    @classmethod
    def _positive_timeout(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("the timeout must be more than 0 seconds")
        return value


class BindSpec(_Strict):
    files: list[str] = Field(default_factory=list)

    @field_validator("files")
    @classmethod
    def _files_inside(cls, files: list[str], info: ValidationInfo) -> list[str]:
        return [_inside(f, "bind.files", info) for f in files]


class PolicySpec(_Strict):
    allow: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    approval_ttl: Duration = 3600.0


class LimitsSpec(_Strict):
    burst: int = Field(default=20, ge=1)
    interval: Duration = 10.0
    cool_down: Duration = 60.0


class CronTriggerSpec(_Strict):
    type: Literal["cron"]
    schedule: str
    timezone: str = "UTC"
    jitter: Duration = 0.0
    catch_up: Literal["once", "none"] = "once"

    @model_validator(mode="after")
    def _valid_schedule(self) -> CronTriggerSpec:
        try:
            tz = zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(
                f"timezone {self.timezone!r} is not an IANA time zone name "
                "(e.g. 'UTC', 'Europe/Paris')"
            ) from exc
        from apscheduler.triggers.cron import CronTrigger  # heavy: only when a cron is used

        try:
            CronTrigger.from_crontab(self.schedule, timezone=tz)
        except ValueError as exc:
            raise ValueError(
                f"schedule {self.schedule!r} is not a five-field cron expression "
                f"(minute hour day month weekday): {exc}"
            ) from exc
        return self


class EveryTriggerSpec(_Strict):
    type: Literal["every"]
    interval: Duration

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value < 1:
            raise ValueError("an 'every' interval must be at least 1s")
        return value


class WatchTriggerSpec(_Strict):
    type: Literal["watch"]
    paths: list[str] = Field(min_length=1)
    exclude: list[str] = Field(default_factory=list)
    debounce: Duration = 0.2

    @field_validator("paths", "exclude")
    @classmethod
    def _globs_inside(cls, globs: list[str], info: ValidationInfo) -> list[str]:
        return [_inside(g, "watch", info) for g in globs]


class GitTriggerSpec(_Strict):
    type: Literal["git"]
    repo: str = "."
    ref: str | None = None
    paths: list[str] = Field(default_factory=lambda: ["**"])

    @field_validator("paths")
    @classmethod
    def _globs_inside(cls, globs: list[str], info: ValidationInfo) -> list[str]:
        return [_inside(g, "git", info) for g in globs]


class MessageTriggerSpec(_Strict):
    type: Literal["message"]


TriggerSpec = Annotated[
    CronTriggerSpec | EveryTriggerSpec | WatchTriggerSpec | GitTriggerSpec | MessageTriggerSpec,
    Field(discriminator="type"),
]


class SessionSpec(_Strict):
    name: str
    goal: str = ""
    description: str = ""
    agent: str = ""
    priority: int = Field(default=0, ge=0, le=100)
    labels: dict[str, str] = Field(default_factory=dict)
    node: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    node_labels: dict[str, str] = Field(default_factory=dict)
    redact: list[str] = Field(default_factory=list)
    run: RunSpec | None = None
    # factories, not shared instances: pydantic would deep-copy a model default
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)  # what the model gateway serves it
    bind: BindSpec = Field(default_factory=BindSpec)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    compact: CompactSpec | None = None
    claude_code: ClaudeCodeSpec | None = None  # [run] kind = "claude-code"
    codex: CodexSpec | None = None  # [run] kind = "codex"
    trigger: list[TriggerSpec] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.fullmatch(name):
            raise ValueError(
                "use 1 to 64 characters from a-z, 0-9, '.', '_' and '-', starting with a "
                "letter or digit"
            )
        return name

    @field_validator("redact")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            try:
                compiled = re.compile(p)
            except re.error as exc:
                raise ValueError(f"{p!r} is not a regular expression: {exc}") from exc
            if compiled.search("") is not None:
                raise ValueError(
                    f"{p!r} matches the empty string, so it would mask between every two "
                    "characters; write a pattern that needs at least one (e.g. '+' for '*')"
                )
        return patterns

    @model_validator(mode="after")
    def _agent_table(self) -> SessionSpec:
        kind = self.run.kind if self.run else None
        check_agent_tables(kind, self.claude_code, self.codex, self.policy)
        return self

    @property
    def has_triggers(self) -> bool:
        """Armed from creation: triggers, or bound files (the dependency trigger)."""
        return bool(self.trigger) or bool(self.bind.files)

    @property
    def workspace(self) -> Path:
        return Path(self.run.cwd) if self.run else Path(".")

    def trigger_summary(self) -> list[str]:
        out = []
        for t in self.trigger:
            if isinstance(t, CronTriggerSpec):
                out.append(f"cron {t.schedule} {t.timezone}")
            elif isinstance(t, EveryTriggerSpec):
                out.append(f"every {t.interval:g}s")
            elif isinstance(t, WatchTriggerSpec):
                out.append(f"watch {' '.join(t.paths)}")
            elif isinstance(t, GitTriggerSpec):
                out.append(f"git {t.ref or 'HEAD'} {' '.join(t.paths)}")
            else:
                out.append("message")
        if self.bind.files:
            out.append(f"dependency {' '.join(self.bind.files)}")
        return out


def _absolute(base: Path, path: object) -> object:
    """``path`` made absolute from ``base``; anything that is not a usable path is
    returned as it came, for validation to refuse with its name."""
    if not isinstance(path, str):
        return path
    try:
        return str((base / path).resolve())
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a name too long
        return path


def _secret_file(base: Path, ref: object) -> object:
    """A secret file taken from the spec's folder, made absolute but not resolved:
    mounted secrets are often symlinks that move when the secret is rotated."""
    if isinstance(ref, dict) and isinstance(ref.get("file"), str) and ref["file"]:
        return {**ref, "file": os.path.normpath(os.path.join(os.path.abspath(base), ref["file"]))}
    return ref


def _resolve(data: TomlTable, base: Path) -> tuple[TomlTable, list[str]]:
    """Make the spec's folder-relative paths absolute, so the stored spec stands alone;
    and the workspace, resolved and as written, for ``_inside``."""
    data = dict(data)
    run = data.get("run")
    workspace = base.resolve()
    written = os.path.abspath(base)
    if isinstance(run, dict):
        run = dict(run)
        cwd = run.get("cwd", ".")
        run["cwd"] = _absolute(base, cwd)
        secrets = run.get("secrets")
        if isinstance(secrets, dict):
            run["secrets"] = {k: _secret_file(base, v) for k, v in secrets.items()}
        if isinstance(run["cwd"], str) and Path(run["cwd"]).is_absolute():
            workspace = Path(run["cwd"])
            written = os.path.abspath(base / cwd) if isinstance(cwd, str) else str(workspace)
        data["run"] = run
    for table in ("claude_code", "codex"):
        agent = data.get(table)
        if isinstance(agent, dict) and isinstance(agent.get("cli"), str) and "/" in agent["cli"]:
            data[table] = {**agent, "cli": os.path.normpath(os.path.join(base, agent["cli"]))}
    triggers = data.get("trigger")
    if isinstance(triggers, list):
        resolved = []
        for trig in triggers:
            if isinstance(trig, dict) and trig.get("type") == "git":
                resolved.append({**trig, "repo": _absolute(workspace, trig.get("repo", "."))})
            else:
                resolved.append(trig)
        data["trigger"] = resolved
    return data, list(dict.fromkeys([str(workspace), written]))


def parse_spec(text: str, *, base: Path, source: str = "spec") -> SessionSpec:
    """Parse and validate a spec; ``base`` is the folder relative paths start from."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise BadSpec(f"{source}: a spec is at most {MAX_SPEC_BYTES} bytes")
    try:
        data = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer of too many digits
        raise BadSpec(f"{source}: not valid TOML: {exc}") from exc
    if (where := _nul_at(data, "")) is not None:
        raise BadSpec(
            f"{source}: {where or 'a key'}: contains a NUL character, which no path, "
            "command or name may hold; remove it"
        )
    if (where := huge_at(data, "")) is not None:
        raise BadSpec(
            f"{source}: {where or 'a key'}: a number beyond 64 bits, which no event can "
            "record; write a smaller one"
        )
    try:
        resolved, workspaces = _resolve(data, base)
        return SessionSpec.model_validate(resolved, context={"workspaces": workspaces})
    except ValidationError as exc:
        raise BadSpec(f"{source}: " + "; ".join(_explain(e) for e in exc.errors())) from exc


def _nul_at(value: object, where: str) -> str | None:
    """Where in the parsed spec a NUL character is (the OS cuts strings at it)."""
    if isinstance(value, str):
        return where if "\x00" in value else None
    items: list[tuple[str, object]] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            if "\x00" in key:
                return f"{where}.{key!r}".lstrip(".")
            items.append((f"{where}.{key}".lstrip("."), inner))
    elif isinstance(value, list):
        items = [(f"{where}[{i}]", inner) for i, inner in enumerate(value)]
    for inner_where, inner in items:
        if (found := _nul_at(inner, inner_where)) is not None:
            return found
    return None


def _explain(error: Any) -> str:
    loc = ".".join(str(p) for p in error["loc"])
    loc = re.sub(r"\.(\d+)\.(cron|every|watch|git|message)\b", r"[\1]", loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{loc}: unknown key; see docs/spec.md for the keys a spec may have"
    if kind == "missing":
        return f"{loc}: required key is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    given = error.get("input")
    if (
        isinstance(given, str | int | float)
        and len(repr(given)) < 80
        and repr(given) not in message
    ):
        message += f" (got {given!r})"
    return f"{loc}: {message}"


def load_spec_file(path: Path) -> tuple[SessionSpec, str]:
    """Read and parse a spec file; returns the spec and its text."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadSpec(f"cannot read spec {path}: {exc.strerror}") from exc
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise BadSpec(f"{path}: a spec must be UTF-8 text") from exc
    return parse_spec(text, base=path.parent, source=str(path)), text


def spec_to_toml(spec: SessionSpec) -> str:
    """The spec as TOML, paths resolved: what is stored as the session's spec.toml."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["name"] = spec.name
    lines: list[str] = []
    tables: list[tuple[str, TomlTable]] = []
    for key, value in data.items():
        if key == "trigger":
            continue
        if isinstance(value, dict) and key not in ("labels", "node_labels"):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, table in tables:
        lines.append(f"\n[{key}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items())
    for trig in data.get("trigger", []):
        lines.append("\n[[trigger]]")
        full = {"type": trig["type"], **trig}
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in full.items())
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        escaped = "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in escaped)
        return f'"{escaped}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
        )
    raise TypeError(f"cannot write {value!r} as TOML")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_value(key)


def under_profile(
    spec: SessionSpec, profile: str, profiles: dict[str, ProfileConfig]
) -> SessionSpec:
    """The spec as a run under runner profile ``profile`` sees it (config.py's
    ProfileConfig): the profile's ``exec`` instead of ``run.exec``, the budget keys
    it sets instead of the spec's, and ``run.profile`` naming it. A profile the
    configuration no longer has (a reload removed it) is ``default``'s."""
    if profile not in profiles:
        profile = "default"
    chosen = profiles[profile]
    update: dict[str, object] = {}  # field -> its value under the profile
    if spec.run is not None:
        run: dict[str, object] = {"profile": profile}
        if chosen.exec is not None:
            run["exec"] = list(chosen.exec)
        update["run"] = spec.run.model_copy(update=run)
    budget = {k: v for k, v in chosen.budget.model_dump().items() if v is not None}
    if budget:
        update["budget"] = spec.budget.model_copy(update=budget)
    return spec.model_copy(update=update) if update else spec
