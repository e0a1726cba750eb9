"""Bad input at the gateway gets the provider's own error shape (so the official SDKs
raise their own errors) and changes nothing: no event in the log, no upstream call.
Malformed JSON, an unknown model, a model the spec does not allow, an oversized body,
no key, another run's key, the key of a finished run."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.harness import Daemon, wait_event, wait_for
from tests.gateway.rig import gateway, session

HOLDER = Path(__file__).parent / "programs" / "holder.py"


def post(url: str, body: bytes, key: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["x-api-key"] = key
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def anthropic_shape(body: Any, kind: str) -> str:
    assert body["type"] == "error"
    assert body["error"]["type"] == kind
    message: str = body["error"]["message"]
    assert message
    return message


def openai_shape(body: Any) -> str:
    assert set(body) == {"error"}
    assert {"message", "type", "code"} <= set(body["error"])
    message: str = body["error"]["message"]
    return message


@pytest.fixture
def held() -> Iterator[tuple[Daemon, Any, dict[str, str], Path]]:
    """A session whose run waits (with its gateway address and key) until released."""
    with gateway(config="[model]\nmax_body = 4096\n") as (d, up):
        cwd = session(d, "held", [], allow=["claude-ok*", "gpt-*"], program=HOLDER)
        os.mkfifo(cwd / "go")
        d.ctl("activate", "held", check=True)
        wait_for((cwd / "env.json").exists, 60, "the run's env.json")
        env = json.loads((cwd / "env.json").read_text())
        yield d, up, env, cwd


def release(cwd: Path) -> None:
    with open(cwd / "go", "w") as f:
        f.write("go")


def test_bad_input_is_refused_in_each_providers_shape_and_changes_nothing(
    held: tuple[Daemon, Any, dict[str, str], Path],
) -> None:
    d, up, env, cwd = held
    base, obase, key = env["ANTHROPIC_BASE_URL"], env["OPENAI_BASE_URL"], env["ANTHROPIC_API_KEY"]
    assert env["OPENAI_API_KEY"] == key
    seq = d.json("show", "held")["seq"]
    ok_messages = {"model": "claude-ok", "max_tokens": 5, "messages": []}

    # malformed JSON
    status, body = post(base + "/v1/messages", b'{"model": "claude-ok", ', key)
    assert status == 400
    assert "not valid JSON" in anthropic_shape(body, "invalid_request_error")
    status, body = post(obase + "/chat/completions", b"[1, 2", key)
    assert status == 400
    assert "not valid JSON" in openai_shape(body)
    # an oversized body
    big = json.dumps({**ok_messages, "pad": "x" * 5000}).encode()
    status, body = post(base + "/v1/messages", big, key)
    assert status == 413
    assert "max_body" in anthropic_shape(body, "request_too_large")
    # no key
    status, body = post(base + "/v1/messages", json.dumps(ok_messages).encode(), None)
    assert status == 401
    assert "no API key" in anthropic_shape(body, "authentication_error")
    status, body = post(obase + "/responses", b"{}", None)
    assert status == 401
    assert openai_shape(body)

    # through the official SDKs, which raise their own errors
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    oclient = openai.OpenAI(base_url=obase, api_key=key, max_retries=0)
    try:
        with pytest.raises(anthropic.NotFoundError) as nf:
            client.messages.create(model="mistral-large", max_tokens=5, messages=[])
        assert "not served by this daemon" in nf.value.message
        with pytest.raises(openai.NotFoundError):
            oclient.chat.completions.create(model="llama-3", messages=[])
        # a model some provider serves, but this session's spec does not allow
        with pytest.raises(anthropic.PermissionDeniedError) as pd:
            client.messages.create(model="claude-other", max_tokens=5, messages=[])
        assert "[model] allow" in pd.value.message
        # another run's key: this run's key at another run's address
        other = anthropic.Anthropic(
            base_url=base.replace("/run/held/", "/run/other/"), api_key=key, max_retries=0
        )
        with pytest.raises(anthropic.AuthenticationError) as au:
            other.messages.create(model="claude-ok", max_tokens=5, messages=[])
        assert "another run" in au.value.message
        other.close()
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=obase, api_key="made-up", max_retries=0).responses.create(
                model="gpt-4", input="x"
            )
    finally:
        client.close()
        oclient.close()

    # nothing changed: not one event, not one call upstream
    assert d.json("show", "held")["seq"] == seq
    assert d.json("log", "held", "--type", "model.requested") == []
    assert up.count == 0

    # the key of a finished run
    release(cwd)
    wait_event(d, "held", "run.finished", timeout=60)
    seq = d.json("show", "held")["seq"]
    with (
        anthropic.Anthropic(base_url=base, api_key=key, max_retries=0) as late,
        pytest.raises(anthropic.AuthenticationError) as gone,
    ):
        late.messages.create(model="claude-ok", max_tokens=5, messages=[])
    assert "ended" in gone.value.message
    assert d.json("show", "held")["seq"] == seq
    assert up.count == 0


def test_a_gateway_that_cannot_listen_stops_the_start_saying_why() -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with (
            pytest.raises(AssertionError, match=f"model gateway cannot listen on 127.0.0.1:{port}"),
            gateway(config=f'[model]\nlisten = "127.0.0.1:{port}"\n') as (_d, _up),
        ):
            pass
    finally:
        taken.close()
