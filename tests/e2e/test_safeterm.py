"""What a session's program writes cannot steer the terminal of the person who
reads it with sessionctl (ctl/safeterm.py): control characters and bidi
overrides are printed as their escapes, `--json` keeps the exact text."""

from __future__ import annotations

import orjson

from sessiond.ctl.safeterm import safe_text, terminal_safe
from tests.e2e.harness import running, wait_event

# Clears the screen, sets the window title, hides the line start behind a
# carriage return, and reverses what follows it (Trojan Source).
HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\rAPPROVED \u202eevil\u2066 done\x9b"
SPEC = 'name = "s"\ngoal = "reads its mail"\n[run]\nexec = ["true"]\ncwd = "{ws}"\n'


def test_the_unsafe_characters_become_their_escapes_and_the_rest_stays() -> None:
    assert safe_text(HOSTILE) == (
        "ok\\x1b[2J\\x1b]0;pwned\\x07\\x0dAPPROVED \\u202eevil\\u2066 done\\x9b"
    )
    assert safe_text("two\nlines\tand tabs, é ✓ 日本") == "two\nlines\tand tabs, é ✓ 日本"
    nested = terminal_safe({"a\x1b": ["\x1b", 1, None, {"b": "\r"}]})
    assert nested == {"a\\x1b": ["\\x1b", 1, None, {"b": "\\x0d"}]}


def test_sessionctl_prints_a_hostile_message_escaped_and_json_keeps_it_exact() -> None:
    with running() as d:
        ws = d.root / "ws"
        ws.mkdir()
        d.ctl("create", str(d.write_spec("s", SPEC.format(ws=ws))), check=True)
        d.ctl("send", "s", HOSTILE, check=True)
        wait_event(d, "s", "message.received")
        for args in (("log", "s"), ("replay", "s", "--view", "messages")):
            shown = d.ctl(*args, check=True).stdout
            assert "APPROVED" in shown, (args, shown)  # the message is shown
            for c in ("\x1b", "\x07", "\r", "\u202e", "\u2066", "\x9b"):
                assert c not in shown, (args, repr(c))
            assert "\\x1b[2J" in shown, (args, shown)
            assert "\\u202e" in shown, (args, shown)
        records = orjson.loads(d.ctl("--json", "log", "s", check=True).stdout)
        texts = [r["data"]["text"] for r in records if r["type"] == "message.received"]
        assert texts == [HOSTILE]  # the log holds what was sent, byte for byte


def test_an_error_naming_what_a_bundle_chose_reaches_stderr_escaped_with_json_too() -> None:
    """An error's text reaches a person on stderr with or without --json (its
    exact text is in the JSON on stdout): it is escaped there in both."""
    from tests.e2e.crafted import bundle_with_pending_approvals

    hostile = ("c1\x1b]0;pwned\x07", "c2\u202e\x1b[2J")
    with running() as d:
        d.ctl("import", str(bundle_with_pending_approvals(d.root, hostile)), check=True)
        for args in (("approve", "asker"), ("--json", "approve", "asker")):
            done = d.ctl(*args)
            assert done.returncode != 0, done
            assert "pending approvals" in done.stderr, done.stderr
            for c in ("\x1b", "\x07", "\u202e"):
                assert c not in done.stderr, (args, repr(done.stderr))
            assert "\\x1b]0;pwned" in done.stderr, done.stderr
        error = orjson.loads(d.ctl("--json", "approve", "asker").stdout)["error"]
        assert all(call in error["message"] for call in hostile)  # exact, for a program
