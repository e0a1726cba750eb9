"""Git, read the cheap way where it is safe: refs from the files under ``.git``.

Reading ``HEAD`` and a branch's ref is a file read (microseconds); a ``git``
process costs milliseconds. The git trigger reads refs on every change under
``.git``, and every command run records the workspace's HEAD, so both read the
files and start ``git`` only for what the files cannot say (a worktree or a
submodule, whose ``.git`` is a file; an unborn branch; a short ref name).
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str, timeout: float = 10) -> str | None:
    """``git -C repo args…``: its output stripped, or None if it failed."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def locate(path: Path) -> tuple[bool, Path | None]:
    """(is ``path`` in a repository, its ``.git`` folder when that is a plain one)."""
    for folder in (path, *path.parents):
        dot = folder / ".git"
        if dot.is_dir():
            return True, dot
        if dot.exists():  # a worktree or submodule: only git knows where it points
            return True, None
    return False, None


def head_ref(repo: Path) -> str | None:
    """What HEAD points at: ``refs/heads/main``, or a commit when detached."""
    found, dot = locate(repo)
    if not found:
        return None
    if dot is not None:
        try:
            head = (dot / "HEAD").read_text().strip()
        except OSError:
            head = ""
        if head.startswith("ref: "):
            return head[5:]
        if head:
            return head
    return git(repo, "symbolic-ref", "-q", "HEAD") or git(
        repo, "rev-parse", "--verify", "-q", "HEAD"
    )


def resolve(repo: Path, ref: str) -> str | None:
    """The commit ``ref`` (``HEAD``, ``refs/...`` or anything git understands) names."""
    found, dot = locate(repo)
    if not found:
        return None
    if dot is not None:
        if ref == "HEAD":
            ref = head_ref(repo) or ""
        if len(ref) == 40 and all(c in "0123456789abcdef" for c in ref):
            return ref  # a detached HEAD is the commit itself
        if ref.startswith("refs/"):
            try:
                value = (dot / ref).read_text().strip()
                if value and not value.startswith("ref: "):
                    return value
            except OSError:
                pass
            try:
                for line in (dot / "packed-refs").read_text().splitlines():
                    if line.endswith(" " + ref) and not line.startswith(("#", "^")):
                        return line.split(" ", 1)[0]
            except OSError:
                pass
    # a short name, an unborn branch, a symbolic ref, a worktree: ask git
    return git(repo, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
