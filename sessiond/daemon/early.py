"""The start of a daemon that serves at once: the early server opened first.

A daemon's imports (pydantic, the event models, structlog, the kernel) take
longer than reading the table index of 10,000 sessions. So ``sessiond`` first
reads what serving needs from its configuration (TOML, the standard library),
takes the state dir's lock, reads the index, binds the control socket, and
serves ``ping`` and ``ps`` on a thread of its own (sessiond.ipc.early); the main
thread meanwhile imports the rest, validates the whole configuration and loads
the table. Then the full server takes over the same listening socket and the
connections (sessiond.ipc.server): no second bind, no moment where a connect
fails; what was asked meanwhile is answered.

The early server is used only where this reading of the configuration is
certainly the full one's (no ``[access]`` users or groups, no ``[run]`` user,
group or uid range, no cluster, not socket-activated, a state dir that exists),
and the daemon checks that it agrees with the validated configuration before it
goes on (:func:`agrees`). Anywhere else the daemon starts as before. A bad
configuration still ends the start with the same error and exit code: the
early server is closed first (its clients are told why, the socket removed).

Nothing here acts on a session: it only reads. After a kill -9 the full start
still syncs the file system before anything appends (the page cache a killed
daemon left is what the early server reads, and what any reader reads).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sessiond.daemon.statedir import StartupError, take_lock
from sessiond.ipc.early import DYNAMIC_UIDS, Early, EarlyConfig, open_server
from sessiond.paths import default_socket, default_state_dir

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing is not imported at run time: its import costs the first answer)
    from typing import Any

    from sessiond.config import DaemonConfig


def early_config(
    path: Path | None, env: Mapping[str, str], state_dir: Path | None, sock: Path | None
) -> EarlyConfig | None:
    """The configuration's paths and the few keys ps needs, or None when this
    reading could differ from the validated one (then the daemon starts without
    the early server, and its configuration's errors are reported as before)."""
    data: dict[str, Any] = {}  # the TOML as parsed: any value, checked where read
    path = path or (Path(env["SESSIOND_CONFIG"]) if env.get("SESSIOND_CONFIG") else None)
    if path is not None:
        try:
            text = path.read_text()
            plain = _plain_toml(text)
            if plain is None:
                import tomllib  # (see _plain_toml)

                data = tomllib.loads(text)
            else:
                data.update(plain)
        except (OSError, ValueError):  # reported by the full reading, before serving
            return None
        base = path.parent.resolve()
        for key in ("state_dir", "socket"):
            if isinstance(data.get(key), str):
                data[key] = base / data[key]
    if env.get("SESSIOND_STATE_DIR"):
        data["state_dir"] = Path(env["SESSIOND_STATE_DIR"])
    if env.get("SESSIOND_SOCKET"):
        data["socket"] = Path(env["SESSIOND_SOCKET"])
    if state_dir is not None:
        data["state_dir"] = state_dir
    if sock is not None:
        data["socket"] = sock
    where = {
        "state_dir": data.get("state_dir", default_state_dir()),
        "socket": data.get("socket", default_socket()),
    }
    if not all(isinstance(p, Path) and "\0" not in str(p) for p in where.values()):
        return None
    access, run, cluster = (data.get(k, {}) for k in ("access", "run", "cluster"))
    if not (isinstance(access, dict) and isinstance(run, dict) and isinstance(cluster, dict)):
        return None
    if access.get("users") or access.get("groups") or cluster.get("dsn") is not None:
        return None  # the socket's ACLs, a cluster's store: the full server's alone
    if any(k in run for k in ("user", "group", "dynamic_uids")):
        return None  # a run's uids: read from the validated configuration only
    sandbox = run.get("sandbox", "on")
    offset = data.get("clock_offset", 0.0)
    if sandbox not in ("on", "off") or type(offset) not in (int, float):
        return None
    try:
        offset = float(offset)
    except OverflowError:  # an integer no float holds: the full reading says what is wrong
        return None
    return EarlyConfig(
        Path(os.path.abspath(where["state_dir"])),
        Path(os.path.abspath(where["socket"])),
        sandbox == "on",
        offset,
    )


# a TOML bare key or table name; and what TOML forbids anywhere in a file but a tab
# and the newlines (a carriage return included: such a file is tomllib's to read)
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_CONTROL = frozenset(map(chr, (*range(0x09), *range(0x0B, 0x20), 0x7F)))
_DIGITS = frozenset("0123456789")


def _plain_toml(text: str) -> dict[str, object] | None:
    """``text`` as tomllib reads it where the file is plain: blank lines, comment
    lines, ``[name]`` headers and ``name = value`` lines whose value is a string
    with no escape and no quote in it, ``true``, ``false`` or a decimal integer.
    None for anything else, and for anything tomllib would refuse (a name given
    twice): tomllib reads it then. Importing tomllib (its parser, its regular
    expressions, string) costs the first answer more than reading such a file
    (tests/test_early_config.py checks both readings agree)."""
    if not _CONTROL.isdisjoint(text):
        return None
    data: dict[str, object] = {}
    table = data
    for raw in text.split("\n"):
        line = raw.strip(" \t")
        if not line or line[0] == "#":
            continue
        if line[0] == "[":
            name = line[1:-1]
            if line[-1] != "]" or not name or not _BARE.issuperset(name) or name in data:
                return None
            table = data[name] = {}
            continue
        key, eq, value = line.partition("=")
        key, value = key.rstrip(" \t"), value.lstrip(" \t")
        if not eq or not key or not _BARE.issuperset(key) or key in table:
            return None
        if len(value) >= 2 and value[0] == value[-1] == '"' and '"' not in value[1:-1]:
            if "\\" in value:
                return None
            table[key] = value[1:-1]
        elif value in ("true", "false"):
            table[key] = value == "true"
        elif value and _DIGITS.issuperset(value.removeprefix("-")) and value != "-":
            digits = value.removeprefix("-")
            if digits[0] == "0" and digits != "0":
                return None  # a leading zero: not TOML
            table[key] = int(value)
        else:
            return None
    return data


def agrees(early: Early, config: DaemonConfig) -> bool:
    """Whether the validated configuration is the one the early server read (else
    the daemon closes it and starts as without it)."""
    from sessiond.sandboxconfig import run_uids

    uids = run_uids(config)
    mine = early.config
    return (
        config.state_dir == mine.state_dir
        and config.socket == mine.socket
        and (config.run.sandbox == "on") == mine.sandbox
        and config.clock_offset == mine.clock_offset
        and not config.access.users
        and not config.access.groups
        and config.cluster.dsn is None
        and config.run.identity() is None
        and uids.dynamic == DYNAMIC_UIDS
        and not uids.accounts
    )


def open_early(
    path: Path | None, env: Mapping[str, str], state_dir: Path | None, sock: Path | None
) -> Early | None:
    """Start the early server, or None where the daemon starts as before (see the
    module's docstring); never an error of its own: the full start reports them."""
    if env.get("LISTEN_PID") == str(os.getpid()):
        return None  # socket activation: systemd's socket takes connections already
    config = early_config(path, env, state_dir, sock)
    if config is None or not config.state_dir.is_dir():
        return None
    try:
        lock = take_lock(config.state_dir)
    except StartupError:
        return None
    try:
        return open_server(config, lock)
    except Exception:  # whatever it is, the full start goes on without it
        # (an index it could not list, say: the full start reads the same files and
        # says what is wrong with them; the early server only ever saves time)
        os.close(lock)
        return None
