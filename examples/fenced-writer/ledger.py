"""A ledger outside sessiond that refuses a stale writer: a small HTTP service
that keeps, per session, the highest epoch it has accepted a write under, and
refuses any write under a lower one (a fencing token, as in Kleppmann's "How
to do distributed locking"). Standard library only.

    python3 ledger.py --port 8765 --ledger ledger.jsonl

POST /write with a JSON body {"session": S, "epoch": N, "text": T} (what
``run.fence()`` gives a program, and its text): 200 and {"ok": true} when N is
at least S's highest epoch so far (N becomes it); 409 and {"ok": false,
"highest": H} when N is lower. Every attempt, accepted or refused, is one line
of the ledger file (JSON: session, epoch, text, ok, at: the service's
monotonic clock, pid: the writer's, when it says), so the ledger also shows who
tried. GET /ledger returns those lines. The highest epochs are read back from
the file at start, so a restarted service still refuses what it refused.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.highest: dict[str, int] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if entry["ok"]:
                    self.highest[entry["session"]] = max(
                        self.highest.get(entry["session"], 0), entry["epoch"]
                    )

    def write(self, session: str, epoch: int, text: str, pid: int | None) -> tuple[bool, int]:
        """Checked and recorded under one lock: no write can slip between the check
        of an epoch and its record."""
        with self.lock:
            highest = self.highest.get(session, epoch)
            ok = epoch >= highest
            if ok:
                self.highest[session] = highest = epoch
            entry = {"session": session, "epoch": epoch, "text": text, "ok": ok,
                     "at": time.monotonic(), "pid": pid}  # fmt: skip
            with self.path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            return ok, highest


def handler(ledger: Ledger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:  # quiet: the ledger is the record
            pass

        def reply(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path != "/ledger":
                self.reply(404, {"error": "GET /ledger or POST /write"})
                return
            with ledger.lock:
                text = ledger.path.read_text() if ledger.path.exists() else ""
            self.reply(200, [json.loads(line) for line in text.splitlines()])

        def do_POST(self) -> None:
            if self.path != "/write":
                self.reply(404, {"error": "POST /write"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                session, epoch, text = body["session"], body["epoch"], body["text"]
                pid = body.get("pid")
                if not isinstance(session, str) or not isinstance(epoch, int) or epoch < 0:
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                self.reply(400, {"error": 'a JSON body {"session": str, "epoch": int >= 0, '
                                          '"text": str} is needed'})  # fmt: skip
                return
            ok, highest = ledger.write(session, epoch, str(text), pid)
            self.reply(200 if ok else 409, {"ok": ok, "highest": highest})

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a writer gone before its answer (killed, as a stale one is): recorded
        super().handle_error(request, client_address)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765, help="0: any free port")
    parser.add_argument("--ledger", type=Path, default=Path("ledger.jsonl"))
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), handler(Ledger(args.ledger)))
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
