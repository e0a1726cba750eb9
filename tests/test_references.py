"""Every reference in the project points into the repository: no file cites the
team's design contract, which lives outside it, and every "docs/design.md
section N" names a section docs/design.md has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]
OUTSIDE = "DESIGN" + ".md"  # spelled apart, so this file does not cite it itself
SECTION = re.compile(r"docs/design\.md,? sections? (\d+)")


def tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def texts() -> list[tuple[Path, str]]:
    out = []
    for path in tracked():
        try:
            out.append((path, path.read_text()))
        except UnicodeDecodeError:
            continue  # an image
    return out


def test_no_file_cites_the_design_contract_outside_the_repository() -> None:
    citing = [str(p.relative_to(ROOT)) for p, text in texts() if OUTSIDE in text]
    assert not citing, f"these cite a file outside the repository: {citing}"


def test_every_cited_section_of_docs_design_md_exists() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    have = {int(n) for n in re.findall(r"^## (\d+)\. ", design, re.M)}
    assert have == set(range(1, 15)), have
    wrong = [
        f"{p.relative_to(ROOT)}: section {n}"
        for p, text in texts()
        for n in SECTION.findall(text)
        if int(n) not in have
    ]
    assert not wrong, wrong
