"""A session program that writes to the ledger outside the database with its
fencing token: the ledger refuses it once a later owner of the session (a
higher epoch) has written there. FENCED_LEDGER is the ledger's address."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

from sessiond.sdk import connect


def write(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        url + "/write", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


with connect() as run:
    fence = run.fence()  # this run's session and epoch
    text = f"run {run.run_id} of {fence.session}"
    body = {"session": fence.session, "epoch": fence.epoch, "text": text, "pid": os.getpid()}
    # A step: a later run of this turn (after a crash) replays the answer, never writes twice.
    status, answer = run.step("ledger_write", lambda: write(os.environ["FENCED_LEDGER"], body))
    if status == 409:  # a later owner of the session wrote there: this run is stale
        print(f"refused: epoch {fence.epoch} < {answer['highest']}", file=sys.stderr)
        sys.exit(1)
    print(f"written under {fence}")
    run.sleep()
