"""Git, read the cheap way where it is safe: refs from the files under ``.git``.

Reading ``HEAD`` and a branch's ref is a file read (microseconds); a ``git``
process costs milliseconds. The git trigger reads refs on every change under
``.git``, and every command run records the workspace's HEAD, so both read the
files and start ``git`` only for what the files cannot say (a worktree or a
submodule, whose ``.git`` is a file; an unborn branch; a short ref name).

Object names are SHA-1 (40 hex digits) or, in a repository made with
``git init --object-format=sha256``, SHA-256 (64 hex digits). All the names in
one repository have the same length, so the length of a name says which: a tree
read by its name holds entries whose binary names are half as many bytes.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import zlib
from pathlib import Path

# hex digits in an object name -> bytes of the name in a tree entry: SHA-1, SHA-256
_NAME_BYTES = {40: 20, 64: 32}
_HEX = frozenset("0123456789abcdef")


def is_object_name(text: str) -> bool:
    """Is ``text`` a full object name (SHA-1 or SHA-256, lowercase hex)?"""
    return len(text) in _NAME_BYTES and _HEX.issuperset(text)


# A repository's own config is not the daemon's to trust: a run writes its
# workspace, ``.git/config`` included, and the daemon is often root. These
# settings (given on the command line, so they beat the repository's) keep a
# ``git`` the daemon starts from running any command the repository names: no
# transport at all (a partial clone's promisor remote would fetch a missing
# object through an ``uploadpack`` or ``ext::`` command of the run's), no
# fsmonitor or hooks, no signature check (``gpg.program``), no external diff.
SAFE_CONFIG = (
    "protocol.allow=never",
    *(f"protocol.{p}.allow=never" for p in ("file", "git", "ssh", "http", "https", "ext")),
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.sshCommand=false",
    "log.showSignature=false",
    "gpg.program=false",
    "diff.external=false",
)
_SAFE_ARGS = tuple(arg for item in SAFE_CONFIG for arg in ("-c", item))
# GIT_NO_LAZY_FETCH: a git that knows it (2.44 and later) fetches nothing missing
_SAFE_ENV = {"GIT_NO_LAZY_FETCH": "1", "GIT_TERMINAL_PROMPT": "0"}


def git(repo: Path, *args: str, timeout: float = 10) -> str | None:
    """``git -C repo args…`` under ``SAFE_CONFIG``: its output stripped, or None
    if it failed."""
    try:
        done = subprocess.run(
            ["git", *_SAFE_ARGS, "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **_SAFE_ENV},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


REF_LIMIT = 4096  # HEAD, a loose ref: a line
FILE_LIMIT = 64 << 20  # packed-refs, a loose commit or tree


def read_plain(path: Path, limit: int = REF_LIMIT) -> bytes:
    """A regular file's bytes, at most ``limit`` of them; OSError otherwise. A run
    writes its workspace's ``.git``: opened without waiting (a FIFO there would
    hold the open, and the daemon's loop with it) and never read past ``limit``
    (a symlink to /dev/zero has no end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, f"{path} is over {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _text(path: Path, limit: int = REF_LIMIT) -> str:
    return read_plain(path, limit).decode(errors="replace")


def locate(path: Path) -> tuple[bool, Path | None]:
    """(is ``path`` in a repository, its git folder when that is a plain one: the
    ``.git`` of a work tree, or a bare repository itself)."""
    if (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir():
        return True, path  # bare: the repository is its own git folder
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
            head = _text(dot / "HEAD").strip()
        except OSError:
            head = ""
        if head.startswith("ref: "):
            return head[5:]
        if head:
            return head
    return git(repo, "symbolic-ref", "-q", "HEAD") or git(
        repo, "rev-parse", "--verify", "-q", "HEAD"
    )


def resolve(repo: Path, ref: str, *, ask_git: bool = True) -> str | None:
    """The commit ``ref`` (``HEAD``, ``refs/...`` or anything git understands) names.

    ``ask_git=False``: from the files alone (symbolic refs followed a few deep),
    None where they cannot say: what the daemon reads of a workspace a run
    writes starts no ``git`` there at all."""
    found, dot = locate(repo)
    if not found:
        return None
    if dot is not None:
        for _ in range(_SYMREF_DEPTH):
            if ref == "HEAD":
                ref = (head_ref(repo) or "") if ask_git else _symref(dot / "HEAD")
            if is_object_name(ref):
                return ref  # a detached HEAD is the commit itself
            if not ref.startswith("refs/"):
                break
            value = _loose(dot, ref)
            if value is None:
                value = _packed(dot, ref)
            if value is None or not value.startswith("ref: "):
                if value is not None and is_object_name(value):
                    return value
                break
            ref = value[5:]  # a symbolic ref: follow it
    if not ask_git:
        return None
    # a short name, an unborn branch, a symbolic ref, a worktree: ask git
    return git(repo, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")


_SYMREF_DEPTH = 5  # git's own limit on symbolic refs pointing at symbolic refs


def _symref(path: Path) -> str:
    try:
        head = _text(path).strip()
    except OSError:
        return ""
    return head[5:] if head.startswith("ref: ") else head


def _loose(dot: Path, ref: str) -> str | None:
    try:
        return _text(dot / ref).strip() or None
    except OSError:
        return None


def _packed(dot: Path, ref: str) -> str | None:
    try:
        for line in _text(dot / "packed-refs", FILE_LIMIT).splitlines():
            if line.endswith(" " + ref) and not line.startswith(("#", "^")):
                return line.split(" ", 1)[0]
    except OSError:
        pass
    return None


# --- what a move of a ref changed, from the loose objects -------------------------
#
# A commit just made is stored as loose objects (zlib-compressed files under
# .git/objects): its commit, its new trees. Reading them takes microseconds where
# `git merge-base` and `git diff` take milliseconds each, and that is most of the
# time between a commit and the wake of a git trigger. Anything else (a packed
# object, a history that is not a plain move forward, a long way between the two
# commits) returns None, and git itself answers.

_ANCESTRY_LIMIT = 256  # commits walked back from the new tip before asking git
_DIR_MODE = "40000"


def _object(dot: Path, sha: str) -> tuple[bytes, bytes] | None:
    """(kind, body) of a loose object; None if it is packed, missing or bad."""
    try:
        packed = read_plain(dot / "objects" / sha[:2] / sha[2:], FILE_LIMIT)
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, FILE_LIMIT)  # bounded: a crafted object may not be
    except (OSError, ValueError, zlib.error):
        return None
    if inflate.unconsumed_tail:
        return None  # larger than any commit or tree read here: git answers
    header, _, body = raw.partition(b"\0")
    return header.split(b" ", 1)[0], body


def _commit(dot: Path, sha: str) -> tuple[str, list[str]] | None:
    """(tree, parents) of a loose commit."""
    obj = _object(dot, sha)
    if obj is None or obj[0] != b"commit":
        return None
    tree, parents = "", []
    for line in obj[1].split(b"\n"):
        if not line:
            break  # the headers end at the first empty line
        if line.startswith(b"tree "):
            tree = line[5:].decode()
        elif line.startswith(b"parent "):
            parents.append(line[7:].decode())
    return (tree, parents) if tree else None


def _tree(dot: Path, sha: str) -> dict[str, tuple[str, str]] | None:
    """name -> (mode, sha) of a loose tree; None when it cannot be read (git answers).

    An entry is ``mode SP name NUL`` and the binary object name, as long as the
    tree's own name says (20 bytes in a SHA-1 repository, 32 in a SHA-256 one)."""
    size = _NAME_BYTES.get(len(sha))
    obj = _object(dot, sha)
    if size is None or obj is None or obj[0] != b"tree":
        return None
    body, entries, i = obj[1], {}, 0
    try:
        while i < len(body):
            space = body.index(b" ", i)
            nul = body.index(b"\0", space)
            name = body[space + 1 : nul].decode(errors="surrogateescape")
            if nul + 1 + size > len(body):
                return None  # cut short: not a tree this code can read
            entries[name] = (body[i:space].decode(), body[nul + 1 : nul + 1 + size].hex())
            i = nul + 1 + size
    except ValueError:  # no space or NUL where one must be, a name not UTF-8
        return None
    return entries


def _diff_trees(dot: Path, a: str | None, b: str | None, prefix: str, out: list[str]) -> bool:
    """Append the paths that differ between trees a and b (None: no tree there)."""
    if a == b:
        return True
    old = _tree(dot, a) if a else {}
    new = _tree(dot, b) if b else {}
    if old is None or new is None:
        return False
    for name in sorted(old.keys() | new.keys()):
        x, y = old.get(name), new.get(name)
        if x == y:
            continue
        path = prefix + name
        x_dir = x is not None and x[0] == _DIR_MODE
        y_dir = y is not None and y[0] == _DIR_MODE
        if x_dir or y_dir:
            sub_x = x[1] if x is not None and x_dir else None
            sub_y = y[1] if y is not None and y_dir else None
            if not _diff_trees(dot, sub_x, sub_y, path + "/", out):
                return False
            if (x is not None and not x_dir) or (y is not None and not y_dir):
                out.append(path)  # a file became a folder, or the other way round
        else:
            out.append(path)
    return True


def moved_forward(repo: Path, old: str, new: str) -> list[str] | None:
    """The paths changed from ``old`` to ``new`` when ``new`` descends from ``old``,
    read from loose objects; None when git must answer (see above)."""
    _, dot = locate(repo)
    if dot is None:
        return None
    seen, todo = {new}, [new]
    while todo and old not in seen:
        if len(seen) > _ANCESTRY_LIMIT:
            return None
        commit = _commit(dot, todo.pop())
        if commit is None:
            return None
        for parent in commit[1]:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    if old not in seen:
        return None  # not an ancestor: a rebase, a reset, a force push
    before, after = _commit(dot, old), _commit(dot, new)
    if before is None or after is None:
        return None
    paths: list[str] = []
    if not _diff_trees(dot, before[0], after[0], "", paths):
        return None
    return sorted(paths)


def git_folder(repo: Path) -> Path:
    """Where a repository's refs change (what a watcher of its commits watches)."""
    _, dot = locate(repo)
    return dot if dot is not None else repo / ".git"
