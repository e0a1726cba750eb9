"""An upstream that echoes the provider's key (a proxy's answer, a model told it)
does not hand it to the run nor to the log: the answer is refused when it is
recorded, as any answer holding a secret is, and the program gets an error
naming where, never the key."""

from __future__ import annotations

from sessiond.gateway.calls import MASK, _masked, _passed
from sessiond.gateway.scripted import Reply, text
from tests.e2e.harness import wait_event
from tests.gateway.rig import ANTHROPIC_KEY, gateway, results, session


def test_an_answer_holding_the_providers_key_is_refused_not_stored_nor_shown() -> None:
    with gateway([Reply.of(text(f"the key you sent: {ANTHROPIC_KEY}"))]) as (d, up):
        cwd = session(d, "echo", [{"api": "messages", "stream": False, "text": "hi"}])
        d.ctl("activate", "echo", check=True)
        wait_event(d, "echo", "run.finished")
        assert up.count == 1
        (got,) = results(cwd)
        assert got["error"] == 400, got
        assert "holds what the session masks" in got["body"]["error"]["message"]
        (responded,) = d.json("log", "echo", "--type", "model.responded")
        assert responded["data"]["status"] == "error"
        for shown in (d.ctl("log", "echo", "--json"), d.ctl("output", "echo"),
                      d.ctl("show", "echo", "--json")):  # fmt: skip
            assert ANTHROPIC_KEY not in shown.stdout + shown.stderr
        assert not any(ANTHROPIC_KEY in str(line) for line in d.lines)
        assert ANTHROPIC_KEY not in (cwd / "results.jsonl").read_text()


def test_a_stream_echoing_the_key_reaches_the_program_masked() -> None:
    # split across the upstream's chunks or not, the key never reaches the program
    with gateway([Reply.of(text(f"the key you sent: {ANTHROPIC_KEY} ok"))]) as (d, up):
        cwd = session(d, "echo", [{"api": "messages", "stream": True, "text": "hi"}])
        d.ctl("activate", "echo", check=True)
        wait_event(d, "echo", "run.finished")
        assert up.count == 1
        assert ANTHROPIC_KEY not in (cwd / "results.jsonl").read_text()
        (responded,) = d.json("log", "echo", "--type", "model.responded")
        assert responded["data"]["status"] == "error"
        assert ANTHROPIC_KEY not in d.ctl("log", "echo", "--json").stdout


def test_masking_holds_back_only_what_may_begin_a_key() -> None:
    keys = [b"sk-secret-123"]
    assert _masked(b"data: {}\n\n", keys) == (b"data: {}\n\n", b"")
    assert _masked(b"abc sk-sec", keys) == (b"abc ", b"sk-sec")
    assert _masked(b"sk-secret-123 and s", keys) == (MASK + b" and ", b"s")
    sent, held = b"", b""
    for part in (b"x sk-se", b"cret-1", b"23 y"):
        safe, held = _masked(held + part, keys)
        sent += safe
    assert sent + held == b"x " + MASK + b" y"


def test_an_upstreams_error_naming_the_key_is_passed_on_masked() -> None:
    key = b"sk-secret-123"
    said = b'{"error": {"message": "invalid key sk-secret-123", "type": "auth"}}'
    answered = _passed("chat", 401, said, [key])
    assert answered.status == 401
    assert isinstance(answered.body, bytes)
    assert key not in answered.body
    assert b"invalid key [a provider key]" in answered.body
