"""A program that never reads its stream holds its connection, not the model.

A run asks a long streamed answer and never reads it: the gateway's writes to it
block. They once held the model's slot with them (and the upstream unread), so
with a provider allowing one call at a time, every other session waited for the
model forever. The upstream is now read at its own pace and the slot given back
once the answer is in: another session's call is served while the first program
still reads nothing; and the unread answer is recorded, so nothing is spent twice."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from sessiond.gateway.scripted import Reply, text
from tests.e2e.harness import wait_event, wait_for
from tests.gateway.rig import gateway, results, session

HOLDER = Path(__file__).parent / "programs" / "holder.py"
# a long answer: more than the sockets between the gateway and the program buffer
LONG = "x" * (16 << 20)


def test_a_stream_nobody_reads_keeps_no_other_session_from_the_model() -> None:
    replies = [Reply.of(text(LONG)), Reply.of(text("served"))]
    with gateway(replies, "concurrency = 1\n") as (d, up):  # the OpenAI provider's
        cwd = session(d, "hog", [], program=HOLDER)
        os.mkfifo(cwd / "go")
        d.ctl("activate", "hog", check=True)
        wait_for((cwd / "env.json").exists, 60, "the run's env.json")
        env = json.loads((cwd / "env.json").read_text())
        url = urlsplit(env["OPENAI_BASE_URL"])
        body = json.dumps({"model": "gpt-test", "stream": True, "messages": []}).encode()
        hog = socket.create_connection((url.hostname, url.port))
        try:
            hog.sendall(
                f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {env['OPENAI_API_KEY']}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )  # and never read
            up.wait_count(1)
            # the long answer is in the log while the program has read none of it
            wait_event(d, "hog", "model.responded")
            other = session(d, "other", [{"api": "chat", "stream": False, "text": "hi"}])
            d.ctl("activate", "other", check=True)
            wait_event(d, "other", "run.finished")
            assert results(other) == [
                {"api": "chat", "text": "served", "stop": "stop", "usage": [10, 5], "tools": []}
            ]
            assert up.count == 2
        finally:
            hog.close()
            with open(cwd / "go", "w") as f:
                f.write("go")


def test_a_call_in_flight_does_not_hold_the_daemons_stop() -> None:
    # the upstream stalls mid-stream: the daemon still stops within its grace (3 s
    # here), not after aiohttp's minute of waiting for the call
    with gateway([Reply.of(text("never finished"), hold=True)]) as (d, up):
        session(d, "stalled", [{"api": "messages", "stream": True, "text": "x"}])
        d.ctl("activate", "stalled", check=True)
        up.wait_count(1)
        assert d.stop() == 0  # (within the harness's 30 s)
        up.release()


def test_a_rerun_waits_for_the_call_its_crashed_run_left_in_flight() -> None:
    # the program dies mid-stream; the gateway reads the stream to its end, and the
    # next run of the turn, sent the same call meanwhile, gets that answer replayed
    # instead of buying it again
    program = Path(__file__).parent / "programs" / "midcrash.py"
    with gateway([Reply.of(text("a long answer"), hold=True)]) as (d, up):
        cwd = session(d, "crashy", [], program=program, retries=1)
        d.ctl("activate", "crashy", check=True)
        up.wait_count(1)
        first = wait_event(d, "crashy", "run.finished")
        assert first["data"]["status"] == "failed"

        def waiting() -> bool:
            return any(x.get("event") == "gateway.waits_for_earlier_call" for x in d.lines)

        # the next run's call is at the gateway: sent again (count 2), or waiting
        wait_for(lambda: up.count >= 2 or waiting(), 60, "the rerun's call")
        up.release()
        wait_event(d, "crashy", "run.finished", since=first["seq"] + 1)
        assert up.count == 1
        assert (cwd / "final.txt").read_text() == "a long answer"
        (responded,) = d.json("log", "crashy", "--type", "model.responded")
        assert responded["data"]["status"] == "ok"
