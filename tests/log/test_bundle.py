"""Export and import: a bundle checks itself, and a bad one is refused whole."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from sessiond.codec import frame
from sessiond.errors import AlreadyExists, BadBundle
from sessiond.log.bundle import export_session, import_session, read_bundle
from sessiond.log.event_data import RunFinished
from sessiond.log.journal import Journal
from sessiond.log.store.files import FileStore
from tests.helpers import arun, tool_call


@pytest.fixture
def exported(state_dir: Path, tmp_path: Path) -> tuple[FileStore, Path]:
    store = FileStore(state_dir)

    async def go() -> None:
        await (await store.create("alpha", spec="name = 'alpha'\n")).close()
        journal = await Journal.open(store, "alpha")
        await journal.append_many(tool_call("c1"))
        ref = store.artifacts("alpha").put(b"the output", "stdout", "text/plain")
        await journal.append(RunFinished(run="r1", status="ok", stdout=ref))
        await journal.close()

    arun(go())
    out = tmp_path / "alpha.bundle"
    manifest = export_session(store, "alpha", out)
    assert manifest["events"]["count"] == 6
    assert len(manifest["artifacts"]) == 1
    return store, out


def test_a_bundle_imports_as_a_copy_with_every_event_and_artifact(
    exported: tuple[FileStore, Path],
) -> None:
    store, bundle = exported
    journal = arun(import_session(store, bundle, name="beta"))
    assert journal.state.imported_from == "alpha"
    assert journal.state.seq == 7
    arun(journal.close())
    source = [line for _, line in store.read_lines("alpha")]
    copy = [line for _, line in store.read_lines("beta")]
    assert copy[:6] == source
    assert list(store.read("beta"))[-1]["type"] == "session.imported"
    ref = next(iter(store.read("alpha", since=6)))["data"]["stdout"]["ref"]
    assert store.artifacts("beta").get(ref) == b"the output"
    assert store.read_spec("beta") == "name = 'alpha'\n"
    with pytest.raises(AlreadyExists):
        arun(import_session(store, bundle))  # "alpha" exists


def _rewrite(bundle: Path, change: Callable[[dict[str, bytes]], None]) -> None:
    with tarfile.open(bundle, "r:gz") as tar:
        members = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            assert f is not None
            members[m.name] = f.read()
    change(members)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    bundle.write_bytes(gzip.compress(buf.getvalue()))


def _tamper_artifact(m: dict[str, bytes]) -> None:
    name = next(n for n in m if n.startswith("artifacts/"))
    m[name] = b"tampered"


def _tamper_events(m: dict[str, bytes]) -> None:
    m["events.jsonl"] = m["events.jsonl"].replace(b'"c1"', b'"c2"', 1)


def _gap(m: dict[str, bytes]) -> None:
    lines = m["events.jsonl"].splitlines(keepends=True)
    m["events.jsonl"] = b"".join(lines[:2] + lines[3:])
    _fix_manifest(m)


def _invalid_event(m: dict[str, bytes]) -> None:
    lines = m["events.jsonl"].splitlines(keepends=True)
    record = orjson.loads(lines[0][:-10])
    record["data"]["risk"]["resume"] = "whenever"  # a good checksum, a bad schema
    lines[0] = frame(orjson.dumps(record))
    m["events.jsonl"] = b"".join(lines)
    _fix_manifest(m)


def _drop_artifact(m: dict[str, bytes]) -> None:
    name = next(n for n in m if n.startswith("artifacts/"))
    del m[name]
    manifest = orjson.loads(m["manifest.json"])
    manifest["artifacts"] = []
    m["manifest.json"] = orjson.dumps(manifest)


def _fix_manifest(m: dict[str, bytes]) -> None:
    import hashlib

    manifest = orjson.loads(m["manifest.json"])
    events = m["events.jsonl"]
    manifest["events"] = {
        "count": events.count(b"\n"),
        "sha256": hashlib.sha256(events).hexdigest(),
        "size": len(events),
    }
    m["manifest.json"] = orjson.dumps(manifest)


def _traversal(m: dict[str, bytes]) -> None:
    m["../../etc/cron.d/evil"] = b"* * * * * root true"


def _extra(m: dict[str, bytes]) -> None:
    m["artifacts/notahash"] = b"x"


CASES: dict[str, tuple[Callable[[dict[str, bytes]], None], str]] = {
    "artifact hash": (_tamper_artifact, "does not match its hash"),
    "events hash": (_tamper_events, "does not match the hash"),
    "seq gap": (_gap, "without gaps"),
    "invalid event": (_invalid_event, r"data\.risk\.resume"),
    "missing artifact": (_drop_artifact, "not in the bundle"),
    "path traversal": (_traversal, "not allowed"),
    "unexpected member": (_extra, "not allowed"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_bundle_is_refused_whole(exported: tuple[FileStore, Path], case: str) -> None:
    store, bundle = exported
    change, message = CASES[case]
    _rewrite(bundle, change)
    with pytest.raises(BadBundle, match=message):
        arun(import_session(store, bundle, name="beta"))
    assert store.names() == ["alpha"]  # nothing was created


def test_links_in_a_bundle_are_refused(exported: tuple[FileStore, Path]) -> None:
    _store, bundle = exported
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("events.jsonl")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    bundle.write_bytes(gzip.compress(buf.getvalue()))
    with pytest.raises(BadBundle, match="not a regular file"):
        read_bundle(bundle)


def test_something_that_is_not_a_bundle_says_so(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(BadBundle, match="not a sessiond bundle"):
        read_bundle(path)
    with pytest.raises(BadBundle, match="cannot read bundle"):
        read_bundle(tmp_path / "missing.bundle")


def test_a_bad_session_name_in_the_manifest_creates_nothing(
    exported: tuple[FileStore, Path],
) -> None:
    store, bundle = exported

    def evil_name(m: dict[str, bytes]) -> None:
        manifest = orjson.loads(m["manifest.json"])
        manifest["session"] = "../../evil"
        m["manifest.json"] = orjson.dumps(manifest)

    _rewrite(bundle, evil_name)
    with pytest.raises(BadBundle, match="not allowed"):
        arun(import_session(store, bundle, name="copy"))
    assert store.names() == ["alpha"]


def test_names_and_refs_with_a_trailing_newline_are_refused() -> None:
    from sessiond.errors import BadName
    from sessiond.log.event_data import ArtifactRef
    from sessiond.names import check_name

    with pytest.raises(BadName):
        check_name("abc\n")
    with pytest.raises(ValueError, match="sha256"):
        ArtifactRef(ref="sha256:" + "a" * 64 + "\n", name="x", size=1)


def test_an_import_refuses_what_the_bundles_own_spec_masks(tmp_path: Path) -> None:
    """A bundle made elsewhere, holding in the clear what its spec masks (in an
    event, or only in an artifact): refused whole, naming where, nothing created."""
    from sessiond.redaction import Redactor

    secret = "sk-" + "Z" * 24
    made = FileStore(tmp_path / "made")

    async def craft(name: str, in_event: bool) -> Path:
        await (await made.create(name, spec=f"name = '{name}'\n")).close()
        journal = await Journal.open(made, name)
        ref = made.artifacts(name).put(f"out {secret}".encode(), "stdout", "text/plain")
        error = secret if in_event else ""
        await journal.append(RunFinished(run="r1", status="ok", stdout=ref, error=error))
        await journal.close()
        out = tmp_path / f"{name}.bundle"
        export_session(made, name, out)
        return out

    def masks(_spec: str | None) -> Redactor:
        return Redactor([r"sk-[A-Za-z0-9]{20,}"])

    target = FileStore(tmp_path / "target")
    for name, in_event, where in (
        ("ev", True, "event 1 (run.finished)"),
        ("art", False, "artifact"),
    ):
        bundle = arun(craft(name, in_event))
        with pytest.raises(BadBundle, match=r"redact patterns mask") as refused:
            arun(import_session(target, bundle, masks=masks))
        assert where in str(refused.value)
        assert secret not in str(refused.value)
        assert name not in target.names()
    # a bundle that holds none of it is imported as ever
    arun(import_session(target, arun(craft("clean", False)), masks=lambda _s: None))
