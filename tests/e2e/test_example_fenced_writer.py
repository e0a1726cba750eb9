"""examples/fenced-writer: the ledger outside the database refuses a stale epoch,
and a run writes there with its fencing token (the real daemon, the real ledger)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.e2e.harness import running, wait_event

EXAMPLE = Path(__file__).parents[2] / "examples" / "fenced-writer"


@contextmanager
def ledger_service(ledger: Path) -> Iterator[str]:
    """The example's ledger.py on a free port; its address."""
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "ledger.py"), "--port", "0", "--ledger", str(ledger)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "listening on URL", once it listens
        assert line.startswith("listening on "), line
        yield line.split()[-1]
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def post(url: str, session: str, epoch: int, text: str = "x") -> tuple[int, dict[str, Any]]:
    body = json.dumps({"session": session, "epoch": epoch, "text": text}).encode()
    request = urllib.request.Request(url + "/write", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_the_ledger_refuses_a_stale_epoch(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    with ledger_service(ledger) as url:
        assert post(url, "s", 3) == (200, {"ok": True, "highest": 3})
        assert post(url, "s", 2) == (409, {"ok": False, "highest": 3})  # stale: refused
        assert post(url, "s", 3)[0] == 200  # the same owner again
        assert post(url, "s", 4)[0] == 200  # a later owner
        assert post(url, "s", 3) == (409, {"ok": False, "highest": 4})
        assert post(url, "other", 0)[0] == 200  # per session
        assert post(url, "s", -1)[0] == 400
    with ledger_service(ledger) as url:  # restarted: it still refuses what it refused
        assert post(url, "s", 3) == (409, {"ok": False, "highest": 4})
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(e["epoch"], e["ok"]) for e in entries if e["session"] == "s"] == [
        (3, True), (2, False), (3, True), (4, True), (3, False), (3, False),
    ]  # fmt: skip


def test_a_run_writes_to_the_ledger_with_its_fencing_token() -> None:
    with running() as d:
        example = d.root / "fenced-writer"
        shutil.copytree(EXAMPLE, example)
        ledger = d.root / "ledger.jsonl"
        with ledger_service(ledger) as url:
            spec = example / "fenced-writer.toml"
            spec.write_text(spec.read_text().replace("http://127.0.0.1:8765", url))
            d.ctl("create", str(spec), check=True)
            d.ctl("send", "fenced-writer", "write", check=True)
            finished = wait_event(d, "fenced-writer", "run.finished")
            assert finished["data"]["exit_code"] == 0, finished
            (entry,) = [json.loads(line) for line in ledger.read_text().splitlines()]
            assert entry["session"] == "fenced-writer"
            assert entry["epoch"] == 0  # one machine: the epoch is 0
            assert entry["ok"] is True
            # A stale writer (an epoch below one the ledger has seen) is refused.
            assert post(url, "fenced-writer", 1)[0] == 200
            assert post(url, "fenced-writer", 0)[0] == 409
