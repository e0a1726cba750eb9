"""Regenerate docs/api.md from the public functions in src/ (deterministic, offline)."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

wake = json.loads(os.environ.get("SESSIOND_WAKE", '{"wakes": []}'))
lines = ["# API", ""]
for path in sorted(Path("src").rglob("*.py")):
    module = ".".join(path.with_suffix("").parts[1:]).removesuffix(".__init__")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            args = ", ".join(a.arg for a in node.args.args)
            lines.append(f"## `{module}.{node.name}({args})`")
            lines += ["", ast.get_docstring(node) or "(no docstring)", ""]
Path("docs/api.md").write_text("\n".join(lines))
cause = wake["wakes"][0] if wake["wakes"] else {}
print(f"docs/api.md regenerated ({cause.get('details', {}).get('range', 'manual')})")
