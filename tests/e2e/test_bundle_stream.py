"""export and import move a bundle's bytes over the connection (issue 13): the
client writes and reads its own files, and no client can make the daemon open a
path it names. A bundle larger than any frame crosses whole; a damaged or cut-off
body imports nothing."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess

import orjson

from tests.e2e.harness import SESSIONCTL, Daemon, running
from tests.faults.hostile import connect, read_answers, rpc, run_job, serving


def _sessions(d: Daemon) -> list[str]:
    return sorted(os.listdir(d.state_dir / "sessions"))


def test_a_client_cannot_make_the_daemon_write_or_read_a_path_it_names() -> None:
    with running() as d:
        run_job(d, "job", "echo evidence")
        target = d.root / "written-by-the-daemon.bundle"
        answer = rpc(d, "export", {"name": "job", "path": str(target)})
        assert answer["ok"] is False
        assert answer["error"]["code"] == "invalid_input"
        assert "sessionctl export NAME -o PATH" in answer["error"]["message"]
        assert not target.exists()
        good = d.root / "job.bundle"
        d.ctl("export", "job", "-o", str(good), check=True)
        answer = rpc(d, "import", {"path": str(good), "name": "copy"})
        assert answer["ok"] is False
        assert answer["error"]["code"] == "invalid_input"
        assert "copy" not in _sessions(d)
        serving(d)


def test_a_bundle_larger_than_a_frame_round_trips_through_files_and_pipes() -> None:
    # 3 MB of output: the stdout artifact alone is three times the 1 MiB frame limit
    with running() as d:
        run_job(d, "big", "head -c 2300000 /dev/urandom | base64")
        bundle = d.root / "big.bundle"
        exported = d.json("export", "big", "-o", str(bundle))
        assert exported["path"] == str(bundle)
        assert exported["bytes"] == bundle.stat().st_size > (1 << 20)
        assert exported["sha256"] == hashlib.sha256(bundle.read_bytes()).hexdigest()
        assert not list(d.state_dir.glob("outbox/*"))  # the daemon's copy is gone
        d.ctl("import", str(bundle), "--as", "copy", check=True)
        # through pipes: export to stdout, import from stdin
        piped = subprocess.run(
            [SESSIONCTL, "export", "big", "-o", "-"], env=d.env, capture_output=True, check=True
        )
        assert piped.stdout[:2] == b"\x1f\x8b"  # a gzip stream, not a summary line
        gzip.decompress(piped.stdout)  # and nothing after it: the summary is on stderr
        assert piped.stderr.startswith(b"exported ")
        subprocess.run(
            [SESSIONCTL, "import", "-", "--as", "piped"],
            env=d.env,
            input=piped.stdout,
            capture_output=True,
            check=True,
        )
        original = [r["data"] for r in d.json("log", "big")]
        assert [r["data"] for r in d.json("log", "copy")][: len(original)] == original
        assert [r["data"] for r in d.json("log", "piped")][: len(original)] == original
        ref = next(r for r in d.json("log", "copy") if r["type"] == "run.finished")
        stdout_ref = ref["data"]["stdout"]["ref"]
        artifact = d.state_dir / "sessions" / "copy" / "artifacts" / stdout_ref[7:]
        assert artifact.stat().st_size > 3_000_000
        assert not list(d.state_dir.glob("inbox/*"))


def test_an_unwritable_output_is_a_clear_error_and_leaves_nothing() -> None:
    with running() as d:
        run_job(d, "job", "echo evidence")
        done = d.ctl("export", "job", "-o", str(d.root / "no-such-folder" / "job.bundle"))
        assert done.returncode == 5
        assert "cannot write" in done.stderr
        assert "no-such-folder" in done.stderr
        assert not list(d.state_dir.glob("outbox/*"))


def test_a_damaged_or_cut_off_body_imports_nothing_and_the_daemon_goes_on() -> None:
    with running() as d:
        run_job(d, "job", "echo evidence")
        good = d.root / "job.bundle"
        d.ctl("export", "job", "-o", str(good), check=True)
        body = good.read_bytes()
        before = _sessions(d)
        # a body whose bytes do not match the sha256 its frame gave
        damaged = bytearray(body)
        damaged[len(damaged) // 2] ^= 0xFF
        frame = {
            "id": 1,
            "method": "import",
            "params": {
                "name": "copy",
                "bytes": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
            },
        }
        with connect(d) as sock:
            sock.sendall(orjson.dumps(frame) + b"\n" + bytes(damaged))
            answer = read_answers(sock, 1)[0]
        assert answer["ok"] is False
        assert "do not match their sha256" in answer["error"]["message"]
        # a body cut off: the client goes away half-way
        with connect(d) as sock:
            sock.sendall(orjson.dumps(frame) + b"\n" + body[: len(body) // 2])
        assert rpc(d, "show", {"name": "copy"})["error"]["code"] == "no_such_session"
        assert _sessions(d) == before
        serving(d)
        assert not list(d.state_dir.glob("inbox/*"))
        d.ctl("import", str(good), "--as", "copy", check=True)  # the whole one still goes in
