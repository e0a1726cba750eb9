"""The house keeps its floors: no module imports a floor above its own.

docs/architecture.md draws the layout; this test is what keeps it true. Every
``import`` and ``from … import`` in sessiond/ is read with ast (those under
``if TYPE_CHECKING:`` and inside functions too: a lazy import still climbs),
and each must point at the module's own floor or one below it. The clients
(sessionctl, sessiond.sdk) may use the ground floor only, so they stay lean.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "sessiond"

# top-down: a floor may import the floors after it in this list, never one before
FLOORS = [
    "daemon",
    "web",
    "gateway",
    "ipc",
    "syscalls",
    "notify",
    "otel",
    "runs",
    "wake",
    "table",
    "log",
]
GROUND = {
    "__init__",
    "codec",
    "config",
    "describe",
    "durations",
    "errors",
    "gitrefs",
    "listing",
    "logquery",
    "logs",
    "modelconfig",
    "names",
    "paths",
    "redaction",
    "sandboxconfig",
    "webconfig",
    "wire",
}
CLIENTS = {"ctl", "sdk"}
# agent frameworks on top of the SDK: sessiond.sdk and the ground floor only
INTEGRATIONS = {"integrations"}
# tools stand on top of everything: they drive the real daemon or the library
TOOLS = {"bench", "demo", "manpages", "localpg", "__main__"}


def floor_of(module: str) -> str:
    """'sessiond.runs.start' -> 'runs'; 'sessiond.config' -> 'ground'."""
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    if head in GROUND:
        return "ground"
    return head


def rank(floor: str) -> int:
    if floor == "ground":
        return len(FLOORS)
    return FLOORS.index(floor)


# The one exception for the clients: `sessionctl check` refuses a spec with the
# daemon's own models and words, imported inside the command only (test_cli_polish
# checks that `sessionctl ps` loads none of it).
CLIENT_LAZY = {
    ("sessiond.ctl.offline", "sessiond.table.spec"),
    ("sessiond.ctl.offline", "sessiond.syscalls.control"),
}


def allowed(importer: str, imported: str) -> bool:
    if (importer, imported) in CLIENT_LAZY:
        return True
    src, dst = floor_of(importer), floor_of(imported)
    if src in TOOLS:
        return True
    if src in CLIENTS:
        return dst in ("ground", src)
    if src in INTEGRATIONS:
        return dst in ("ground", "sdk", src)
    if dst in CLIENTS or dst in TOOLS or dst in INTEGRATIONS:
        return False  # the daemon never imports a client or a tool
    if src == dst:
        return True
    return rank(dst) > rank(src)


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if name == "sessiond":
                # `from sessiond import x`: x is a module or package, or a name of
                # sessiond/__init__.py (the ground floor: __version__)
                for a in node.names:
                    is_module = (ROOT / f"{a.name}.py").exists() or (ROOT / a.name).is_dir()
                    found.append((node.lineno, f"sessiond.{a.name}" if is_module else name))
            else:
                found.append((node.lineno, name))
    return [(line, name) for line, name in found if name.split(".")[0] == "sessiond"]


def modules() -> list[tuple[Path, str]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out.append((path, ".".join(parts)))
    return out


def test_every_module_is_on_a_known_floor() -> None:
    known = set(FLOORS) | {"ground"} | CLIENTS | INTEGRATIONS | TOOLS
    unknown = [m for _, m in modules() if floor_of(m) not in known]
    assert not unknown, f"modules outside the house: {unknown}; place them in docs/architecture.md"


@pytest.mark.parametrize(
    ("path", "module"), modules(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_no_import_climbs_a_floor(path: Path, module: str) -> None:
    climbs = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
        for line, name in imports_of(path, module)
        if not allowed(module, name)
    ]
    assert not climbs, "\n".join(climbs)


def test_the_checker_sees_a_climb() -> None:
    """The rule itself can fail: a table module importing runs is refused."""
    assert not allowed("sessiond.table.gate", "sessiond.runs.start")
    assert not allowed("sessiond.ctl", "sessiond.log.state")
    assert not allowed("sessiond.log.replay", "sessiond.sdk")
    assert allowed("sessiond.runs.start", "sessiond.table.gate")
    assert allowed("sessiond.ctl", "sessiond.wire")
    assert allowed("sessiond.integrations.pydantic_ai", "sessiond.sdk")
    assert not allowed("sessiond.integrations.pydantic_ai", "sessiond.runs.steps")
    assert not allowed("sessiond.runs.steps", "sessiond.integrations.pydantic_ai")


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p, _ in modules()
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, f"split these where their concepts part: {long}"
