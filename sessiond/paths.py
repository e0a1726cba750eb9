"""Default locations (docs/design.md section 6). Imported by sessionctl: stdlib only."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # pathlib only where a Path is made: sessionctl needs none
    from pathlib import Path


def socket_path(env: dict[str, str] | None = None) -> str:
    """``SESSIOND_SOCKET``, else ``$XDG_RUNTIME_DIR/sessiond/sessiond.sock``, else (root)
    ``/run/sessiond/sessiond.sock``, else ``/tmp/sessiond-$UID/sessiond.sock``."""
    env = dict(os.environ) if env is None else env
    if env.get("SESSIOND_SOCKET"):
        return env["SESSIOND_SOCKET"]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "sessiond", "sessiond.sock")
    if os.geteuid() == 0:
        return "/run/sessiond/sessiond.sock"
    return f"/tmp/sessiond-{os.geteuid()}/sessiond.sock"


def default_socket(env: dict[str, str] | None = None) -> Path:
    """:func:`socket_path` as a Path."""
    from pathlib import Path

    return Path(socket_path(env))


def default_state_dir(env: dict[str, str] | None = None) -> Path:
    """``/var/lib/sessiond`` for root, else ``$XDG_STATE_HOME/sessiond``
    (``~/.local/state/sessiond``)."""
    from pathlib import Path

    env = dict(os.environ) if env is None else env
    if os.geteuid() == 0:
        return Path("/var/lib/sessiond")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sessiond"


def program_socket(control: Path) -> Path:
    """The program endpoint beside the control socket ``control``: ``s.sock`` ->
    ``s.program.sock``. Programs get this path as ``SESSIOND_SOCKET``."""
    return control.with_name(f"{control.stem}.program{control.suffix or '.sock'}")


def gateway_socket(control: Path) -> Path:
    """The model gateway's socket beside the control socket ``control``: ``s.sock`` ->
    ``s.gateway.sock``. A run without a network reaches the gateway through it."""
    return control.with_name(f"{control.stem}.gateway{control.suffix or '.sock'}")
