"""Hostile paths against the real daemon: names, references, bundles and
symlinks that would make it read or write outside its place are refused with a
clear error, the daemon still serves, and nothing is lost.

* path traversal in session names (create, show, log, send, fork --as, import --as);
* absolute paths in a spec's workspace paths (``run.writes``, ``bind.files``, watch
  and git ``paths``): outside the workspace refused naming the path and the
  workspace, inside it stored relative (docs/design.md section 7);
* artifact references: traversal inside a bundle's events or member names, an
  artifact replaced by a symlink in the state dir, a reference quoted in tool
  arguments (data, not evidence: export and fork must still work);
* bundles with wrong hashes, a seq gap, a repeated seq, links, traversal, and
  paths that are not files (a FIFO, /dev/zero, a folder), through ``sessionctl import``;
* symlinks planted in the state dir before start (a session folder, a log, a
  dangling log, a spec, the lock file).

Covered elsewhere, not repeated: bad bundles at library level
(tests/log/test_bundle.py), planted symlinks at library level (tests/log/test_file_log.py).
The helpers and the suite's overview are in tests/faults/hostile.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import orjson

from sessiond.codec import decode_line, frame
from tests.e2e.harness import running, wait_event
from tests.faults.hostile import (
    SENTINEL,
    everything,
    make_sentinel,
    refused,
    rpc,
    run_job,
    serving,
)
from tests.log.test_bundle import _fix_manifest, _gap, _rewrite, _tamper_artifact

# --- 1. path traversal in session names ------------------------------------------------------


EVIL_NAMES = ["../evil", "../../evil", "a/../../evil", "/tmp/evil", ".evil", "..", "Evil",
              "x" * 65, "evil\n"]  # fmt: skip


def test_path_traversal_in_session_names_is_refused_wherever_a_name_goes_in() -> None:
    with running() as d:
        make_sentinel(d)
        bundle = d.root / "keep.bundle"
        d.ctl("export", SENTINEL, "-o", str(bundle), check=True)
        before = everything(d)
        for n, evil in enumerate(EVIL_NAMES):
            spec = d.write_spec(f"spec-{n}", f"name = {orjson.dumps(evil).decode()}\n")
            refused(d.ctl("--json", "create", str(spec)), "bad_spec", f"{spec}: name:", repr(evil))
            for args in (
                ("show", evil),
                ("log", evil),
                ("send", evil, "hi"),
                ("fork", SENTINEL, "--as", evil),
                ("import", str(bundle), "--as", evil),
            ):
                refused(d.ctl("--json", *args), "bad_name", repr(evil), "is not allowed")
        # The daemon's own checks, not only sessionctl's: a NUL goes only by RPC.
        for method, params in (
            ("show", {"name": "x\x00y"}),
            ("fork", {"name": SENTINEL, "new": "../\x00evil"}),
            ("merge", {"child": SENTINEL, "into": "../evil"}),
        ):
            answer = rpc(d, method, params)
            assert answer["error"]["code"] == "bad_name", answer
        serving(d)
        assert everything(d) == before
        made = [p for p in d.root.rglob("*") if "evil" in p.name.lower()]
        assert made == [], made
        assert os.listdir(d.state_dir / "sessions") == [SENTINEL]  # no leftover temp folder


# --- 1b. absolute paths in a spec ---------------------------------------------------------


WORKSPACE_PATHS = [
    ("run.writes", "writes = [{p}]\n"),
    ("bind.files", "[bind]\nfiles = [{p}]\n"),
    ("trigger[0].paths", '[[trigger]]\ntype = "watch"\npaths = [{p}]\n'),
    ("trigger[0].paths", '[[trigger]]\ntype = "git"\npaths = [{p}]\n'),
]


def test_absolute_spec_paths_refused_outside_the_workspace_stored_relative_inside() -> None:
    with running() as d:
        make_sentinel(d)
        ws = d.root / "ws"
        ws.mkdir()
        subprocess.run(["git", "init", "-q", str(ws)], check=True)  # for the git trigger
        run = f'[run]\nexec = ["true"]\ncwd = "{ws}"\n'
        before = everything(d)
        for n, (key, table) in enumerate(WORKSPACE_PATHS):
            for outside in ("/etc/passwd", f"{ws}/../elsewhere", f"{d.state_dir}/sessions"):
                quoted = orjson.dumps(outside).decode()
                spec = d.write_spec(f"out{n}", f'name = "out{n}"\n{run}{table.format(p=quoted)}')
                refused(
                    d.ctl("--json", "create", str(spec)),
                    "bad_spec",
                    f"{spec}: {key}: {outside!r} is outside the workspace {ws}",
                )
        serving(d)
        assert everything(d) == before
        for n, (key, table) in enumerate(WORKSPACE_PATHS):
            quoted = orjson.dumps(f"{ws}/data/a.csv").decode()
            spec = d.write_spec(f"in{n}", f'name = "in{n}"\n{run}{table.format(p=quoted)}')
            d.ctl("create", str(spec), check=True)
            stored = (d.state_dir / "sessions" / f"in{n}" / "spec.toml").read_text()
            assert '"data/a.csv"' in stored, (key, stored)
            assert f"{ws}/data" not in stored, (key, stored)
        serving(d)


# --- 2. artifact references ------------------------------------------------------------------


def test_an_artifact_replaced_by_a_symlink_is_never_read_through() -> None:
    with running() as d:
        finished = run_job(d, "job", "echo evidence")
        ref = finished["data"]["stdout"]["ref"]
        before = everything(d)
        secret = d.root / "secret"
        secret.write_bytes(b"not the daemon's to read\n")
        artifact = d.state_dir / "sessions" / "job" / "artifacts" / ref[7:]
        artifact.unlink()
        artifact.symlink_to(secret)
        out = d.root / "job.bundle"
        refused(
            d.ctl("--json", "export", "job", "-o", str(out)),
            "artifact_corrupt",
            ref,
            "cannot be read safely",
        )
        assert not out.exists()
        refused(d.ctl("--json", "fork", "job", "--as", "copy"), "artifact_corrupt", ref)
        gate = orjson.loads(d.ctl("--json", "gate", "job").stdout)  # exit 1: not ok
        check = next(c for c in gate["checks"] if c["name"] == "artifacts intact")
        assert check["ok"] is False
        assert ref in check["detail"]
        serving(d)
        assert everything(d) == before
        assert sorted(os.listdir(d.state_dir / "sessions")) == ["job"]
        copies = [p for p in d.state_dir.rglob("*") if p.is_file() and not p.is_symlink()]
        assert all(secret.read_bytes() not in p.read_bytes() for p in copies)


SDK_QUOTER = """
from sessiond.sdk import connect
with connect() as run:
    quoted = {"ref": "sha256:" + "0" * 64, "name": "made up", "size": 1}
    run.step("read_file", lambda: "read", args={"path": "x", "see": quoted}, side_effect="read",
             idempotency="safe", resume="replay-from-event")
"""


def test_a_reference_quoted_in_tool_arguments_is_data_and_export_and_fork_still_work() -> None:
    with running() as d:
        program = d.root / "quoter.py"
        program.write_text(SDK_QUOTER)
        (d.root / "w").mkdir()
        spec = (
            f'name = "agent"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{program}"]\n'
            f'cwd = "{d.root / "w"}"\n'
        )
        d.ctl("create", str(d.write_spec("agent", spec)), check=True)
        d.ctl("activate", "agent", check=True)
        wait_event(d, "agent", "run.finished")
        intent = d.json("log", "agent", "--type", "tool.intent")[0]
        assert intent["data"]["args"]["see"]["ref"] == "sha256:" + "0" * 64
        out = d.root / "agent.bundle"
        d.ctl("export", "agent", "-o", str(out), check=True)
        exported = d.json("log", "agent")
        d.ctl("fork", "agent", "--as", "child", check=True)
        d.ctl("import", str(out), "--as", "again", check=True)
        logs = everything(d)
        assert logs["again"][: len(exported)] == exported
        assert logs["child"][: len(exported)] == exported
        serving(d)


# --- 3. bundles through `sessionctl import` -------------------------------------------------


def _event_ref_traversal(m: dict[str, bytes]) -> None:
    """A run.finished whose stdout reference climbs out of the store (good checksum)."""
    lines = m["events.jsonl"].splitlines(keepends=True)
    for i, line in enumerate(lines):
        record = decode_line(line[:-1])
        assert record is not None
        if record["type"] == "run.finished":
            record["data"]["stdout"]["ref"] = "sha256:../../../../etc/passwd"
            lines[i] = frame(orjson.dumps(record))
    m["events.jsonl"] = b"".join(lines)
    _fix_manifest(m)


def _repeated_seq(m: dict[str, bytes]) -> None:
    lines = m["events.jsonl"].splitlines(keepends=True)
    m["events.jsonl"] = b"".join([*lines[:3], lines[2], *lines[3:]])
    _fix_manifest(m)


def _member_traversal(m: dict[str, bytes]) -> None:
    m["artifacts/../../../evil"] = b"planted"


def _absolute_member(m: dict[str, bytes]) -> None:
    m["/tmp/evil"] = b"planted"


def _tamper_events(m: dict[str, bytes]) -> None:
    events = bytearray(m["events.jsonl"])
    events[20] ^= 1  # one bit, the manifest as it was
    m["events.jsonl"] = bytes(events)


def _wrong_manifest_hash(m: dict[str, bytes]) -> None:
    manifest = orjson.loads(m["manifest.json"])
    manifest["events"]["sha256"] = "0" * 64
    m["manifest.json"] = orjson.dumps(manifest)


BAD_BUNDLES: dict[str, tuple[Callable[[dict[str, bytes]], None], str]] = {
    "artifact hash": (_tamper_artifact, "does not match its hash"),
    "events hash": (_tamper_events, "does not match the hash"),
    "manifest hash": (_wrong_manifest_hash, "does not match the hash"),
    "seq gap": (_gap, "without gaps"),
    "repeated seq": (_repeated_seq, "without gaps"),
    "ref traversal": (_event_ref_traversal, "stdout.ref"),
    "member traversal": (_member_traversal, "'artifacts/../../../evil' is not allowed"),
    "absolute member": (_absolute_member, "'/tmp/evil' is not allowed"),
}


def _with_link(bundle: Path, out: Path) -> None:
    """The bundle with its events.jsonl swapped for a symlink to /etc/passwd."""
    with tarfile.open(bundle, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for info in src.getmembers():
            if info.name == "events.jsonl":
                link = tarfile.TarInfo("events.jsonl")
                link.type = tarfile.SYMTYPE
                link.linkname = "/etc/passwd"
                dst.addfile(link)
            else:
                dst.addfile(info, src.extractfile(info))


def test_a_bad_bundle_is_refused_whole_by_import_and_the_daemon_goes_on() -> None:
    with running() as d:
        make_sentinel(d)
        run_job(d, "job", "echo evidence")
        good = d.root / "job.bundle"
        d.ctl("export", "job", "-o", str(good), check=True)
        before = everything(d)
        cases: list[tuple[str, Path, str]] = []
        for case, (change, needle) in sorted(BAD_BUNDLES.items()):
            path = d.root / f"{case.replace(' ', '-')}.bundle"
            shutil.copy(good, path)
            _rewrite(path, change)
            cases.append((case, path, needle))
        _with_link(good, d.root / "link.bundle")
        cases.append(("link member", d.root / "link.bundle", "links are refused"))
        fifo = d.root / "fifo.bundle"
        os.mkfifo(fifo)  # opened without O_NONBLOCK it would block the whole daemon
        cases += [
            ("fifo", fifo, "not a regular file"),
            ("endless device", Path("/dev/zero"), "not a regular file"),
            ("folder", d.root, "not a regular file"),
            ("missing", d.root / "missing.bundle", "cannot read bundle"),
        ]
        for case, path, needle in cases:
            done = d.ctl("--json", "import", str(path), "--as", "copy")
            message = refused(done, "bad_bundle", needle)
            assert str(path) in message, (case, message)  # which file, of several
            assert rpc(d, "show", {"name": "copy"})["error"]["code"] == "no_such_session", case
            assert sorted(os.listdir(d.state_dir / "sessions")) == ["job", SENTINEL], case
        serving(d)
        assert everything(d) == before
        d.ctl("import", str(good), "--as", "copy", check=True)  # the good one still imports


# --- 4. symlinks planted in the state dir before start ----------------------------------------


def test_symlinks_planted_in_the_state_dir_block_their_session_and_are_never_followed() -> None:
    with running() as d:
        planted = ["folder", "log", "dangling", "spec"]
        for name in [*planted, "fine"]:
            d.ctl("create", str(d.write_spec(name, f'name = "{name}"\n')), check=True)
            d.ctl("send", name, "keep me", check=True)
        before = everything(d)
        d.stop()
        sessions = d.state_dir / "sessions"
        outside = d.root / "outside"
        outside.mkdir()
        shutil.move(sessions / "folder", outside / "folder")
        (sessions / "folder").symlink_to(outside / "folder")
        shutil.move(sessions / "log" / "events.jsonl", outside / "events.jsonl")
        (sessions / "log" / "events.jsonl").symlink_to(outside / "events.jsonl")
        shutil.move(sessions / "dangling" / "events.jsonl", outside / "dangling.jsonl")
        (sessions / "dangling" / "events.jsonl").symlink_to(outside / "nowhere")
        victim = outside / "spec.toml"  # what a followed symlink would make it run
        victim.write_text(f'name = "spec"\n[run]\nexec = ["touch", "{outside / "ran"}"]\n')
        shutil.move(sessions / "spec" / "spec.toml", outside / "real-spec.toml")
        (sessions / "spec" / "spec.toml").symlink_to(victim)
        contents = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}

        d.start()
        rows = {row["name"]: row for row in d.json("ps")}
        assert sorted(rows) == sorted([*planted, "fine"])  # none vanished
        for name in planted:
            assert rows[name]["state"] == "blocked", rows[name]
            assert "is a symbolic link" in rows[name]["reason"], rows[name]
            logged = [line for line in d.lines if line.get("session") == name]
            assert any(line.get("level") == "error" for line in logged), name
            refused(d.ctl("--json", "send", name, "x"), "refused", "symbolic link")
            refused(d.ctl("--json", "activate", name), "refused", "symbolic link")
        for name in ("folder", "log", "dangling"):
            refused(d.ctl("--json", "log", name), "storage", "is a symbolic link")
        assert d.ctl("export", "folder", "-o", str(d.root / "f.bundle")).returncode == 70
        assert not (d.root / "f.bundle").exists()
        assert rows["fine"]["state"] == "created"
        d.ctl("send", "fine", "still served", check=True)
        assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == contents
        assert not (outside / "ran").exists()
        serving(d)

        # Nothing was lost: with the real files back, every session is whole again.
        d.stop()
        (sessions / "folder").unlink()
        shutil.move(outside / "folder", sessions / "folder")
        for name, src in (("log", "events.jsonl"), ("dangling", "dangling.jsonl")):
            (sessions / name / "events.jsonl").unlink()
            shutil.move(outside / src, sessions / name / "events.jsonl")
        (sessions / "spec" / "spec.toml").unlink()
        shutil.move(outside / "real-spec.toml", sessions / "spec" / "spec.toml")
        d.start()
        after = everything(d)
        assert after["fine"][: len(before["fine"])] == before["fine"]
        assert {n: after[n] for n in planted} == {n: before[n] for n in planted}


def test_a_lock_file_planted_as_a_symlink_stops_the_start_and_its_target_is_untouched() -> None:
    with running() as d:
        make_sentinel(d)
        before = everything(d)
        d.stop()
        victim = d.root / "victim"
        victim.write_bytes(b"precious\n")
        lock = d.state_dir / "sessiond.lock"
        lock.unlink()
        lock.symlink_to(victim)
        d.start(wait=False)
        assert d.proc is not None
        assert d.proc.wait(30) == 1
        d.stop()  # collects what it said
        said = " ".join(str(line.get("text", "")) for line in d.lines)
        assert f"{lock} is a symbolic link" in said, d.lines
        assert victim.read_bytes() == b"precious\n"
        lock.unlink()
        d.start()
        assert everything(d) == before
