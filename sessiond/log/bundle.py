"""Export and import of a session as one self-checking bundle.

A bundle is a gzip'd tar with exactly these members::

    manifest.json          format, version, session, sha256 and size of every other member
    events.jsonl           the log, framed lines exactly as on disk
    spec.toml              (if the session has one)
    artifacts/<sha256>     every artifact the events reference

Import trusts nothing: member names and types are checked before anything is
read, every hash is verified, every event is fully validated (not the replay
fast path), seqs must run 1..N without a gap, every referenced artifact must be
present. Any failure refuses the bundle whole and nothing is created.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import hashlib
import io
import os
import re
import stat
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import orjson

from sessiond import __version__
from sessiond.codec import decode_line, rfc3339
from sessiond.errors import BadBundle, InvalidInput
from sessiond.log.event_data import EventData, SessionImported
from sessiond.log.events import decode
from sessiond.log.evidence import Evidence
from sessiond.log.journal import Journal
from sessiond.log.lineage import artifact_refs
from sessiond.log.masking import mask
from sessiond.log.pace import Pacer
from sessiond.log.store.base import Draft, Durability, Store
from sessiond.log.store.durable import FILE_MODE
from sessiond.log.store.lines import RecordBuilder
from sessiond.names import check_name
from sessiond.redaction import Redactor

BUNDLE_FORMAT = "sessiond-bundle"
BUNDLE_VERSION = 1
ARTIFACT_MEMBER = re.compile(r"^artifacts/([0-9a-f]{64})$")
FIXED_MEMBERS = frozenset({"manifest.json", "events.jsonl", "spec.toml"})
MANIFEST_LIMIT = 16 << 20
DEFAULT_LIMIT = 4 << 30  # bytes of content a bundle may unpack to


class Member(TypedDict):
    """A member of the bundle as its manifest names it: its sha256 and size."""

    sha256: str
    size: int


class Events(Member):
    count: int


class Manifest(TypedDict):
    """``manifest.json``: what the bundle holds (``_manifest`` checks one read back)."""

    format: str
    version: int
    session: str
    exported_at: str | None
    sessiond: str
    events: Events
    spec: Member | None
    artifacts: list[Member]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = FILE_MODE
    info.mtime = mtime
    tar.addfile(info, io.BytesIO(data))


def export_session(store: Store, name: str, out: Path, *, now_ns: int | None = None) -> Manifest:
    """Write ``name`` as a bundle to ``out`` (atomically) and return its manifest."""
    lines: list[bytes] = []
    evidence = Evidence()
    for record, line in store.read_lines(name):
        lines.append(line)
        evidence.add(record)
    refs = set(evidence.wanted(store.artifacts(name)))
    return _write_bundle(store, name, out, lines, refs, now_ns=now_ns)


async def export_paced(
    store: Store, name: str, out: Path, *, upto: int | None = None, now_ns: int | None = None
) -> Manifest:
    """:func:`export_session` for the daemon: events 1..``upto`` read a slice at a
    time in the loop, the bundle compressed and written in a thread (zlib, hashing
    and the writes release the GIL), so the loop serves everyone meanwhile."""
    lines: list[bytes] = []
    evidence = Evidence()
    pacer = Pacer()
    for record, line in store.read_lines(name, upto=upto):
        lines.append(line)
        evidence.add(record)
        if pacer.due():
            await pacer.pause()
    # what a gc removed stays out; a chunked context's parts go in
    refs = set(evidence.wanted(store.artifacts(name)))
    return await asyncio.to_thread(
        functools.partial(_write_bundle, store, name, out, lines, refs, now_ns=now_ns)
    )


class _Lines(io.RawIOBase):
    """The log's lines as one readable file, joined a group at a time (never the
    whole log in one join, which would hold the GIL for as long as it copies)."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self.next = 0
        self.buf = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while (size < 0 or len(self.buf) < size) and self.next < len(self.lines):
            self.buf += b"".join(self.lines[self.next : self.next + 256])
            self.next += 256
        if size < 0:
            size = len(self.buf)
        out, self.buf = self.buf[:size], self.buf[size:]
        return out


def _write_bundle(  # noqa: PLR0917 (one call site each; keywords add nothing)
    store: Store,
    name: str,
    out: Path,
    lines: list[bytes],
    refs: set[str],
    now_ns: int | None = None,
) -> Manifest:
    now_ns = time.time_ns() if now_ns is None else now_ns
    digest, size = hashlib.sha256(), 0
    for start in range(0, len(lines), 1024):
        group = b"".join(lines[start : start + 1024])
        digest.update(group)
        size += len(group)
    spec = store.read_spec(name)
    spec_bytes = b"" if spec is None else spec.encode()
    artifacts = store.artifacts(name)
    blobs = {ref[7:]: artifacts.get(ref) for ref in sorted(refs)}
    manifest: Manifest = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "session": name,
        "exported_at": rfc3339(now_ns),
        "sessiond": __version__,
        "events": {"count": len(lines), "sha256": digest.hexdigest(), "size": size},
        "spec": None if spec is None else {"sha256": _sha(spec_bytes), "size": len(spec_bytes)},
        "artifacts": [{"sha256": d, "size": len(b)} for d, b in blobs.items()],
    }
    mtime = now_ns // 1_000_000_000
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=mtime) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            _add(tar, "manifest.json", orjson.dumps(manifest, option=orjson.OPT_INDENT_2), mtime)
            info = tarfile.TarInfo("events.jsonl")
            info.size, info.mode, info.mtime = size, FILE_MODE, mtime
            tar.addfile(info, _Lines(lines))
            if spec is not None:
                _add(tar, "spec.toml", spec_bytes, mtime)
            for digest_hex, blob in blobs.items():
                _add(tar, f"artifacts/{digest_hex}", blob, mtime)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # durable before it is published under its name
        finally:
            os.close(fd)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return manifest


@dataclass(frozen=True)
class Bundle:
    """A bundle read and verified in memory, ready to become a session."""

    manifest: Manifest
    lines: list[bytes]
    spec: str | None
    artifacts: dict[str, bytes]
    sha256: str


def read_bundle(path: Path, *, limit: int = DEFAULT_LIMIT) -> Bundle:
    """Read and verify a bundle completely; raises BadBundle naming the first problem."""
    unpacked = _unpack(path, limit)
    lines = unpacked.lines
    for _ in _verify_lines(path, lines, unpacked.manifest, unpacked.artifacts):
        pass
    return Bundle(unpacked.manifest, lines, unpacked.spec, unpacked.artifacts, unpacked.sha256)


async def read_bundle_paced(path: Path, *, limit: int = DEFAULT_LIMIT) -> Bundle:
    """:func:`read_bundle` for the daemon: unpacked and hashed in a thread (zlib and
    hashlib release the GIL), each event checked in the loop a slice at a time."""
    unpacked = await asyncio.to_thread(_unpack, path, limit)
    pacer = Pacer()
    for _ in _verify_lines(path, unpacked.lines, unpacked.manifest, unpacked.artifacts):
        if pacer.due():
            await pacer.pause()
    return unpacked


def _unpack(path: Path, limit: int) -> Bundle:
    """The bundle's members, every hash checked; the events split into lines but not
    yet checked one by one (:func:`_verify_lines`)."""
    raw = _read_file(path, limit)
    try:
        members = _members(raw, limit)
    except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile) as exc:
        raise BadBundle(f"{path} is not a sessiond bundle (a gzip'd tar): {exc}") from exc
    except BadBundle as exc:  # name the file, as every other refusal does
        raise BadBundle(f"{path}: {exc}") from None
    manifest = _manifest(members, path)
    events = members.get("events.jsonl")
    if events is None:
        raise BadBundle(f"{path}: events.jsonl is missing")
    _expect_hash(path, "events.jsonl", events, manifest["events"])
    spec_bytes = members.get("spec.toml")
    if (spec_bytes is None) != (manifest.get("spec") is None):
        raise BadBundle(
            f"{path}: spec.toml and the manifest disagree about whether there is a spec"
        )
    if spec_bytes is not None:
        _expect_hash(path, "spec.toml", spec_bytes, manifest["spec"])
    artifacts: dict[str, bytes] = {}
    listed = {a.get("sha256") for a in manifest.get("artifacts", []) if isinstance(a, dict)}
    for member, data in members.items():
        m = ARTIFACT_MEMBER.fullmatch(member)
        if m:
            if _sha(data) != m.group(1):
                raise BadBundle(f"{path}: {member} does not match its hash")
            artifacts[m.group(1)] = data
    if set(artifacts) != listed:
        raise BadBundle(f"{path}: the artifacts present differ from those the manifest lists")
    if events and not events.endswith(b"\n"):
        raise BadBundle(f"{path}: events.jsonl ends in the middle of a line")
    lines = [line + b"\n" for line in events.split(b"\n")[:-1]]
    if len(lines) != manifest["events"].get("count"):
        raise BadBundle(f"{path}: the manifest counts {manifest['events'].get('count')!r} events")
    try:
        spec = None if spec_bytes is None else spec_bytes.decode()
    except UnicodeDecodeError as exc:
        raise BadBundle(f"{path}: spec.toml is not UTF-8") from exc
    return Bundle(manifest, lines, spec, artifacts, _sha(raw))


def _read_file(path: Path, limit: int) -> bytes:
    """The bundle's bytes, from a regular file only. The daemon reads the path it is
    given in its event loop: a FIFO would block it forever (O_NONBLOCK opens one
    without waiting for a writer) and a device like /dev/zero would never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadBundle(f"cannot read bundle {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadBundle(f"bundle {path} is not a regular file; give the path of a bundle")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)  # bounded even if the file grows while it is read
        if max(st.st_size, len(raw)) > limit:
            raise BadBundle(f"bundle {path} is more than the {limit} bytes allowed")
        return raw
    except OSError as exc:
        raise BadBundle(f"cannot read bundle {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _members(raw: bytes, limit: int) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    total = 0
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        for info in tar:
            name = info.name
            if name == "artifacts" and info.isdir():
                continue
            if name not in FIXED_MEMBERS and not ARTIFACT_MEMBER.fullmatch(name):
                raise BadBundle(
                    f"bundle member {name!r} is not allowed: a bundle holds manifest.json, "
                    "events.jsonl, spec.toml and artifacts/<sha256> only"
                )
            if not info.isreg():
                raise BadBundle(f"bundle member {name!r} is not a regular file (links are refused)")
            if name in members:
                raise BadBundle(f"bundle member {name!r} appears twice")
            total += info.size
            if total > limit:
                raise BadBundle(f"the bundle unpacks to more than {limit} bytes")
            fileobj = tar.extractfile(info)
            if fileobj is None:
                raise BadBundle(f"bundle member {name!r} cannot be read")
            members[name] = fileobj.read()
    return members


def _manifest(members: dict[str, bytes], path: Path) -> Manifest:
    raw = members.get("manifest.json")
    if raw is None:
        raise BadBundle(f"{path}: manifest.json is missing")
    if len(raw) > MANIFEST_LIMIT:
        raise BadBundle(f"{path}: manifest.json is too large")
    try:
        manifest: Manifest = orjson.loads(raw)  # its shape is checked below
    except orjson.JSONDecodeError as exc:
        raise BadBundle(f"{path}: manifest.json is not JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BadBundle(f"{path}: manifest.json is not a {BUNDLE_FORMAT} manifest")
    if manifest.get("version") != BUNDLE_VERSION:
        raise BadBundle(
            f"{path}: bundle version {manifest.get('version')!r} is not {BUNDLE_VERSION}; "
            "import it with the sessiond that wrote it, or upgrade"
        )
    if not isinstance(manifest.get("events"), dict) or not isinstance(manifest.get("session"), str):
        raise BadBundle(f"{path}: manifest.json lacks 'events' or 'session'")
    try:
        check_name(manifest["session"], what="the bundle's session name")
    except InvalidInput as exc:
        raise BadBundle(f"{path}: {exc}") from exc
    if not isinstance(manifest.get("artifacts", []), list) or not all(
        isinstance(a, dict) for a in manifest.get("artifacts", [])
    ):
        raise BadBundle(f"{path}: manifest.json 'artifacts' must be a list of objects")
    if not isinstance(manifest.get("exported_at"), str | None):
        raise BadBundle(f"{path}: manifest.json 'exported_at' must be a time")
    return manifest


def _expect_hash(path: Path, member: str, data: bytes, entry: Any) -> None:
    if (
        not isinstance(entry, dict)
        or entry.get("sha256") != _sha(data)
        or entry.get("size") != len(data)
    ):
        raise BadBundle(f"{path}: {member} does not match the hash and size in the manifest")


def _verify_lines(
    path: Path, lines: list[bytes], manifest: Manifest, artifacts: dict[str, bytes]
) -> Iterator[None]:
    """Check each event in turn (one step a line, so the daemon can pace it)."""
    del manifest  # its count was checked with the split
    # Absent artifacts, by the last event naming them: fine once a later gc.collected
    # records their removal (a gc before the export), else the bundle is short.
    absent: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        record = decode_line(line[:-1])
        if record is None:
            raise BadBundle(f"{path}: events.jsonl line {number} fails its checksum")
        if record.get("seq") != number:
            raise BadBundle(
                f"{path}: events.jsonl line {number} has seq {record.get('seq')!r}; seqs must "
                "run 1, 2, 3... without gaps"
            )
        try:
            decode(record)
        except InvalidInput as exc:
            raise BadBundle(f"{path}: {exc}") from exc
        if record.get("type") == "gc.collected":
            for gone in record["data"].get("artifacts", ()):
                absent.pop(gone.get("artifact"), None)
        for ref in artifact_refs(record["data"]):
            if ref[7:] not in artifacts:
                absent[ref] = number
        yield None
    for ref, number in absent.items():
        raise BadBundle(f"{path}: event {number} references {ref}, which is not in the bundle")


def _refuse_unmasked(path: Path, bundle: Bundle, r: Redactor) -> None:
    """Refuse a bundle that holds what its own spec masks: a session never stores it,
    and a bundle sessiond exported has it masked already (one made elsewhere may
    not). Refused, not masked: an artifact is named by its hash, which a mask
    would change under the events that reference it."""
    for number, line in enumerate(bundle.lines, start=1):
        record = decode_line(line[:-1])
        data = decode(record).data if record is not None else None
        if data is not None and mask(data, r) is not data:
            raise BadBundle(
                f"{path}: event {number} ({record and record['type']}) holds what the "
                "session's redact patterns mask, which sessiond never stores; export it "
                "from a daemon that masks it, or remove the secret from the bundle"
            )
    for digest, blob in bundle.artifacts.items():
        if r.search(blob.decode(errors="surrogateescape")):
            raise BadBundle(
                f"{path}: artifact sha256:{digest} holds what the session's redact "
                "patterns mask, which sessiond never stores; export it from a daemon that "
                "masks it, or remove the secret from the bundle"
            )


async def import_session(
    store: Store,
    path: Path,
    *,
    name: str | None = None,
    durability: Durability = "fsync",
    then: Callable[[list[bytes]], Sequence[EventData]] | None = None,
    masks: Callable[[str | None], Redactor | None] | None = None,
) -> Journal:
    """Create a session from a verified bundle; it arrives with ``session.imported``,
    and the events ``then`` makes of the bundle's lines (a hand-over's
    ``migration.arriving``). They are written with the log, in the one rename that
    creates the session: a crash never leaves a copy without them."""
    bundle = await read_bundle_paced(path)  # verified whole before anything is created
    if masks is not None and (redactor := masks(bundle.spec)) is not None:
        await asyncio.to_thread(_refuse_unmasked, path, bundle, redactor)
    target = check_name(name if name is not None else bundle.manifest["session"])
    drafts = [
        Draft(
            SessionImported(
                original_name=bundle.manifest["session"],
                bundle_sha256=bundle.sha256,
                exported_at=bundle.manifest.get("exported_at"),
                events=len(bundle.lines),
            )
        )
    ]
    drafts += [Draft(data) for data in (then(bundle.lines) if then is not None else ())]
    clock = getattr(store, "clock", time.time_ns)  # the backends' clock (tests set one)
    builder = RecordBuilder(target, clock)
    builder.stamp = store.copy_stamp(bundle.lines)  # a cluster's node and epoch
    _, arrival = builder.build(len(bundle.lines), drafts)
    new_log = await store.create(
        target,
        spec=bundle.spec,
        lines=[*bundle.lines, arrival],
        artifacts=bundle.artifacts.values(),
        durability=durability,
    )
    await new_log.close()
    return await Journal.open(store, target, durability=durability)
