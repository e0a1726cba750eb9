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
FLOORS = ["daemon", "web", "ipc", "syscalls", "notify", "otel", "runs", "wake", "table", "log"]
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
    "names",
    "paths",
    "redaction",
    "replies",
    "sandboxconfig",
    "sdkwire",
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


# --- no import circles ------------------------------------------------------------
#
# Two modules that import each other can be neither read nor tested alone, and the
# order in which they load decides whether one sees the other half made. Every
# import counts: at module level, under ``if TYPE_CHECKING:`` (the types still tie
# the two together: neither can be understood without the other) and inside a
# function (a lazy import is a circle postponed, not removed).

# Circles known today and being removed by the cluster floor's move (issue 28):
# the lead empties this after merging it. A circle that no longer exists must
# leave the list, so that the list can only shrink.
KNOWN_CIRCLES: dict[str, frozenset[str]] = {
    "daemon/ cluster <-> placement": frozenset(
        {"sessiond.daemon.cluster", "sessiond.daemon.placement"}
    ),
    "pg/ nodes <-> placement": frozenset(
        {"sessiond.log.store.pg.nodes", "sessiond.log.store.pg.placement"}
    ),
}


def import_graph() -> dict[str, set[str]]:
    """module -> the sessiond modules it imports (``from p import m`` of a
    submodule ``m`` is an import of ``p.m``; of any other name, of ``p``)."""
    known = {module for _, module in modules()}
    graph: dict[str, set[str]] = {}
    for path, module in modules():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    name = ".".join([*base, node.module] if node.module else base)
                else:
                    name = node.module or ""
                for a in node.names:
                    if f"{name}.{a.name}" in known:
                        found.add(f"{name}.{a.name}")
                    elif name in known:
                        found.add(name)
        found.discard(module)
        graph[module] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm,
    without recursion: the graph is a few hundred modules deep at most)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.add(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(frozenset(part))
    return found


def test_no_import_circle() -> None:
    found = circles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES.values()]
    assert not new, (
        f"import circles: {new}; break each with a protocol the lower module names, "
        "or move the piece both need below both"
    )
    gone = [name for name, c in KNOWN_CIRCLES.items() if c not in found]
    assert not gone, f"these circles are gone: take them off KNOWN_CIRCLES: {gone}"


def test_the_checker_sees_a_circle() -> None:
    """Through a lazy import and a package, and only where there is one."""
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
        "e": {"d"},
        "f": {"g"},
        "g": {"f"},
    }
    assert sorted(sorted(c) for c in circles(graph)) == [["a", "b", "c"], ["f", "g"]]
    assert circles({"a": {"b"}, "b": set()}) == []
