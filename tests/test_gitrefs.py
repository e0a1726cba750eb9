"""sessiond.gitrefs against git itself, on real repositories: refs read from the
files, and the paths a move forward changed read from loose objects."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sessiond import gitrefs
from sessiond.gitrefs import git_folder, head_ref, moved_forward, resolve

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=ENV, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def git_paths(repo: Path, old: str, new: str) -> list[str]:
    names = git(repo, "-c", "core.quotepath=off", "diff", "--no-renames", "--name-only", old, new)
    return sorted(p for p in names.splitlines() if p)


@functools.cache
def _can_make_sha256() -> bool:
    with tempfile.TemporaryDirectory() as probe:
        done = subprocess.run(
            ["git", "init", "-q", "--object-format=sha256", probe],
            capture_output=True,
            check=False,
        )
    return done.returncode == 0


def make_repo(folder: Path, object_format: str) -> Path:
    if object_format == "sha256" and not _can_make_sha256():
        pytest.skip("this machine's git cannot create a SHA-256 repository (git >= 2.29 can)")
    git(folder, "init", "-q", "-b", "main", f"--object-format={object_format}")
    (folder / "src" / "deep").mkdir(parents=True)
    (folder / "src" / "a.py").write_text("a\n")
    (folder / "src" / "deep" / "b.py").write_text("b\n")
    (folder / "README.md").write_text("r\n")
    commit(folder, "first")
    return folder


# every test runs on a SHA-1 repository and on a SHA-256 one (64-hex names, 32-byte
# names in tree entries): gitrefs must read both
@pytest.fixture(params=["sha1", "sha256"])
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return make_repo(tmp_path, str(request.param))


def test_refs_are_read_as_git_reads_them(repo: Path) -> None:
    assert head_ref(repo) == "refs/heads/main"
    assert resolve(repo, "HEAD") == git(repo, "rev-parse", "HEAD")
    assert resolve(repo, "refs/heads/main") == git(repo, "rev-parse", "HEAD")
    assert resolve(repo, "main") == git(repo, "rev-parse", "HEAD")  # a short name: git
    git(repo, "pack-refs", "--all")  # the ref now lives in packed-refs only
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert resolve(repo, "refs/heads/main") == git(repo, "rev-parse", "HEAD")
    assert resolve(repo / "src" / "deep", "HEAD") == git(repo, "rev-parse", "HEAD")
    assert resolve(repo.parent / "nowhere-a-repo", "HEAD") is None


def test_the_paths_of_a_move_forward_are_the_paths_git_names(repo: Path) -> None:
    start = git(repo, "rev-parse", "HEAD")

    def file_to_folder() -> None:
        (repo / "src" / "a.py").unlink()
        (repo / "src" / "a.py").mkdir()
        (repo / "src" / "a.py" / "x").write_text("x\n")

    steps: list[Callable[[], object]] = [
        lambda: (repo / "src" / "a.py").write_text("a2\n"),  # a change
        lambda: (repo / "src" / "deep" / "new.py").write_text("n\n"),  # an addition, nested
        (repo / "README.md").unlink,  # a deletion
        lambda: (repo / "src" / "deep" / "b.py").rename(repo / "docs.md"),  # a rename
        file_to_folder,
        lambda: (repo / "naïve name.txt").write_text("é\n"),  # not ASCII
        lambda: None,  # an empty commit
    ]
    tips = [start]
    for i, step in enumerate(steps):
        step()
        tips.append(commit(repo, f"step {i}"))
    for old in tips:
        for new in tips[tips.index(old) :]:
            assert moved_forward(repo, old, new) == git_paths(repo, old, new), (old, new)


def test_a_merge_is_a_move_forward_and_a_rewrite_is_left_to_git(repo: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "src" / "side.py").write_text("s\n")
    side = commit(repo, "side")
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("r2\n")
    commit(repo, "main")
    git(repo, "merge", "-q", "--no-edit", "side")
    merged = git(repo, "rev-parse", "HEAD")
    assert moved_forward(repo, base, merged) == git_paths(repo, base, merged)
    assert moved_forward(repo, side, merged) == git_paths(repo, side, merged)
    git(repo, "reset", "-q", "--hard", base)
    (repo / "src" / "other.py").write_text("o\n")
    rewritten = commit(repo, "rewritten")
    assert moved_forward(repo, merged, rewritten) is None  # not a descendant: git answers


def test_packed_objects_are_left_to_git(repo: Path) -> None:
    old = git(repo, "rev-parse", "HEAD")
    (repo / "src" / "a.py").write_text("a3\n")
    new = commit(repo, "more")
    git(repo, "gc", "-q")  # every object now in a pack
    assert moved_forward(repo, old, new) is None


def test_a_bare_repository_is_its_own_git_folder(repo: Path, tmp_path: Path) -> None:
    bare = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    old = git(bare, "rev-parse", "refs/heads/main")
    assert git_folder(bare) == bare
    assert resolve(bare, "refs/heads/main") == old
    assert head_ref(bare) == "refs/heads/main"
    (repo / "src" / "a.py").write_text("pushed\n")
    new = commit(repo, "pushed")
    git(repo, "push", "-q", str(bare), "main")  # a few objects arrive loose
    assert resolve(bare, "refs/heads/main") == new
    assert moved_forward(bare, old, new) in (None, git_paths(bare, old, new))


def test_a_sha256_repository_is_read_from_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path, "sha256")
    assert git(repo, "rev-parse", "--show-object-format") == "sha256"
    old = git(repo, "rev-parse", "HEAD")
    assert len(old) == 64
    (repo / "src" / "a.py").write_text("a4\n")
    (repo / "src" / "deep" / "c.py").write_text("c\n")
    new = commit(repo, "sha256")
    git(repo, "checkout", "-q", "--detach", new)
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(gitrefs, "git", lambda _repo, *args, **_kw: calls.append(args))
    assert resolve(repo, "HEAD") == new  # a detached 64-hex HEAD is the commit itself
    assert resolve(repo, "refs/heads/main") == new
    assert moved_forward(repo, old, new) == ["src/a.py", "src/deep/c.py"]
    assert calls == []  # all of it read from the files, no git process


def test_a_crafted_loose_object_is_not_inflated_past_the_bound(tmp_path: Path) -> None:
    """A run writes its workspace's .git: a loose 'commit' that inflates without
    end is read as unreadable (git answers), not into the daemon's memory."""
    import zlib

    from sessiond import gitrefs

    dot = tmp_path / ".git"
    sha = "ab" * 20
    (dot / "objects" / sha[:2]).mkdir(parents=True)
    bomb = zlib.compressobj()
    data = bomb.compress(b"commit 0\0") + bomb.compress(b"\0" * (gitrefs.FILE_LIMIT + 1))
    (dot / "objects" / sha[:2] / sha[2:]).write_bytes(data + bomb.flush())
    assert gitrefs._object(dot, sha) is None
