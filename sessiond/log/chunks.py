"""A model call's context as chunks shared between calls (docs/design.md section 6).

An agent re-sends its whole conversation with every model call, so storing each
call's context whole costs O(n²) bytes over n calls. Here a big context is cut
into content-addressed chunks, put in the session's artifact store like any
artifact, and the event references a small *manifest* (media type
:data:`CHUNKED_MEDIA`) that lists them. Two calls whose contexts share a prefix
share that prefix's chunks, so a conversation stores each message about once.

The cut points depend only on the bytes before them: a context is cut after
each ``}`` that closes one object of an array and is followed by ``,{`` (the
boundary between two messages, content parts or tools), and pieces are joined
until a chunk holds at least :data:`CHUNK_MIN` bytes. Where the cut falls is
only a matter of sharing; any cut gives back the same bytes. The manifest lists
the chunks through index chunks (grouped the same way: by content), so a
manifest stays small however long the conversation is, and consecutive calls
share their index chunks too.

Manifest::

    {"format": "sessiond-chunks", "v": 1, "size": N, "sha256": "<hex of the whole>",
     "media_type": "application/json",
     "index": [["<hex of an index chunk>", <bytes>], ...],
     "tail": [["<hex of a chunk>", <bytes>], ...]}

an index chunk is ``[["<hex of a chunk>", <bytes>], ...]``, and ``tail`` lists the
last chunks, those no index chunk holds yet. The whole is the index chunks'
chunks in order, then the tail's. Reading checks
each chunk's hash (the store does) and the whole one against the manifest.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import orjson

from sessiond.errors import ArtifactCorrupt
from sessiond.log.event_data import SHA256_HEX, ArtifactRef
from sessiond.log.store.base import ArtifactStore
from sessiond.sdkwire import ArtifactJson

CHUNKED_MEDIA = "application/vnd.sessiond.chunks+json"
MANIFEST_FORMAT = "sessiond-chunks"
# Contexts smaller than this are stored whole: one file, as before chunking.
CHUNK_THRESHOLD = 16 * 1024
CHUNK_MIN = 4 * 1024
# An index chunk ends after a chunk whose digest's first 32 bits are 0 mod this
# (about this many chunks an index chunk), so index chunks are shared too.
INDEX_FANOUT = 16

_BOUNDARY = re.compile(rb"\},\{")


def cut(data: bytes) -> list[bytes]:
    """``data`` cut into chunks of at least CHUNK_MIN bytes (the last may be smaller)."""
    chunks: list[bytes] = []
    start = 0
    for m in _BOUNDARY.finditer(data):
        end = m.start() + 1
        if end - start >= CHUNK_MIN:
            chunks.append(data[start:end])
            start = end
    if start < len(data):
        chunks.append(data[start:])
    return chunks


def _closes(entry: list[Any]) -> bool:
    """Whether an index chunk ends after this chunk (decided by its digest alone)."""
    return int(entry[0][:8], 16) % INDEX_FANOUT == 0


def _groups(entries: list[list[Any]]) -> Iterator[list[list[Any]]]:
    group: list[list[Any]] = []
    for entry in entries:
        group.append(entry)
        if _closes(entry):
            yield group
            group = []
    if group:
        yield group


def put_context(
    artifacts: ArtifactStore, data: bytes, name: str, media_type: str = "application/json"
) -> ArtifactRef:
    """Store a model call's context: whole when small, else as shared chunks and a
    manifest (whose reference is returned, with media type CHUNKED_MEDIA)."""
    if len(data) < CHUNK_THRESHOLD:
        return artifacts.put(data, name, media_type)
    chunks = cut(data)
    entries: list[list[Any]] = [[hashlib.sha256(c).hexdigest(), len(c)] for c in chunks]
    groups = list(_groups(entries))
    # The last group, still open (the next call's chunks would join it), stays in
    # the manifest: a call then writes its new chunks and its manifest, and an
    # index chunk only when one closes.
    tail = groups.pop() if groups and not _closes(groups[-1][-1]) else []
    bodies = [orjson.dumps(group) for group in groups]
    index = [[hashlib.sha256(b).hexdigest(), len(b)] for b in bodies]
    manifest = {
        "format": MANIFEST_FORMAT,
        "v": 1,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "media_type": media_type,
        "index": index,
        "tail": tail,
    }
    # all in one go: the store syncs the new files together (most are there already)
    items = [(c, f"{name}.chunk", media_type) for c in chunks]
    items += [(b, f"{name}.index", "application/json") for b in bodies]
    items.append((orjson.dumps(manifest), name, CHUNKED_MEDIA))
    return artifacts.put_many(items)[-1]


def _entries(raw: bytes, what: str) -> list[tuple[str, int]]:
    try:
        value = orjson.loads(raw)
        out = [(str(d), int(n)) for d, n in value]
    except (orjson.JSONDecodeError, TypeError, ValueError):
        raise ArtifactCorrupt(f"{what} is not a list of [digest, size] pairs") from None
    for digest, _ in out:
        if not SHA256_HEX.fullmatch(digest):
            raise ArtifactCorrupt(f"{what} names {digest!r}, which is not a sha256 digest")
    return out


class ChunkManifest(TypedDict, total=False):
    """A chunked context's manifest (``put_context``), as read back from its artifact:
    every field is looked at with ``.get``, checked as it is used."""

    format: str
    v: int
    size: int
    sha256: str
    media_type: str
    index: list[list[Any]]  # [digest, size] pairs (``_entries`` checks them)
    tail: list[list[Any]]


def _manifest(artifacts: ArtifactStore, ref: str) -> ChunkManifest:
    manifest: ChunkManifest | None
    try:
        manifest = orjson.loads(artifacts.get(ref))
    except orjson.JSONDecodeError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ArtifactCorrupt(f"artifact {ref} is not a chunk manifest ({MANIFEST_FORMAT})")
    return manifest


def parts(
    artifacts: ArtifactStore, ref: str, *, missing: Callable[[str], bool] | None = None
) -> list[str]:
    """The references a manifest depends on: its index chunks and their chunks. An
    index chunk that is not stored raises ArtifactMissing, unless ``missing(ref)``
    says that is fine (a gc removed it): then its own chunks are not listed."""
    manifest = _manifest(artifacts, ref)
    out = []
    for digest, _ in _entries(orjson.dumps(manifest.get("index")), f"manifest {ref}"):
        index_ref = f"sha256:{digest}"
        out.append(index_ref)
        if missing is not None and not artifacts.has(index_ref) and missing(index_ref):
            continue
        out.extend(
            f"sha256:{d}" for d, _ in _entries(artifacts.get(index_ref), f"index {index_ref}")
        )
    out.extend(f"sha256:{d}" for d, _ in _tail(manifest, ref))
    return out


def _tail(manifest: ChunkManifest, ref: str) -> list[tuple[str, int]]:
    return _entries(orjson.dumps(manifest.get("tail", [])), f"manifest {ref}")


def read_context(artifacts: ArtifactStore, ref: ArtifactRef | ArtifactJson) -> bytes:
    """The exact bytes of a stored context, whole or chunked (each part hash-checked)."""
    if isinstance(ref, dict):
        ref = ArtifactRef.model_validate(ref)
    if ref.media_type != CHUNKED_MEDIA:
        return artifacts.get(ref.ref)
    manifest = _manifest(artifacts, ref.ref)
    pieces: list[bytes] = []
    for digest, _ in _entries(orjson.dumps(manifest.get("index")), f"manifest {ref.ref}"):
        index = artifacts.get(f"sha256:{digest}")
        pieces.extend(artifacts.get(f"sha256:{d}") for d, _ in _entries(index, "index"))
    pieces.extend(artifacts.get(f"sha256:{d}") for d, _ in _tail(manifest, ref.ref))
    data = b"".join(pieces)
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256") or len(data) != manifest.get(
        "size"
    ):
        raise ArtifactCorrupt(f"the chunks of {ref.ref} do not make the context it describes")
    return data
