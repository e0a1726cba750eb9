"""`sessionctl` imports only what the command it runs uses (issue 27).

Each command line runs as the real `sessionctl` process against a real daemon,
under ``python -X importtime``, which names every module the process imported.
None of the heavy ones may be among them: no pydantic and no event models, no
orjson (the standard library's json carries the frames), no typing, dataclasses
or pathlib where the command has no use for them, and no other command's module.
What the lean parser of one command parses is what the parser of every command
would: the same help, the same options, and every error still the full parser's;
and a plain command line (PLAIN: ``ping``, ``send NAME TEXT``...), read without
argparse at all, is read as argparse reads it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from sessiond.ctl import MODULE_COMMANDS, PLAIN, parser, plain
from sessiond.ctl.parsing import command_word
from sessiond.wire import RemoteError, encode, plain_encode
from tests.e2e.harness import HANG, SESSIONCTL, Daemon, running

# what no sessionctl command named below may import
HEAVY = ("pydantic", "orjson", "typing", "dataclasses", "inspect", "shutil", "asyncio",
         "structlog", "uvloop", "aiohttp", "apprise", "opentelemetry", "difflib", "datetime",
         "pathlib", "argparse", "gettext")  # fmt: skip
# what every command imports of sessiond: the client and its output
BASE = {
    "sessiond",
    "sessiond.ctl",
    "sessiond.ctl.render",
    "sessiond.ctl.safeterm",
    "sessiond.paths",
    "sessiond.wire",
}


def _imports(d: Daemon, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``sessionctl args`` as the daemon's user would; the modules it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", SESSIONCTL, *args],
        env=d.env,
        capture_output=True,
        text=True,
        timeout=HANG,
        check=False,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "sessiond.ctl" in modules, done.stderr  # importtime saw the client at all
    return done, modules


def _lean(modules: set[str], own: set[str], allowed: tuple[str, ...] = ()) -> None:
    heavy = sorted(
        m for m in modules if m.split(".")[0] in HEAVY and m.split(".")[0] not in allowed
    )
    assert not heavy, f"imported what the command does not use: {heavy}"
    ours = {m for m in modules if m.split(".")[0] == "sessiond"}
    assert ours == BASE | own, f"sessiond modules beyond the command's: {sorted(ours - BASE)}"


def test_ping_ps_send_show_create_approve_import_only_what_they_use() -> None:
    with running() as d:
        spec = d.write_spec("docs", 'name = "docs"\n[[trigger]]\ntype = "message"\n')

        done, modules = _imports(d, "create", str(spec))
        assert done.returncode == 0, done.stderr
        assert "created docs" in done.stdout
        # the spec file is read as a Path, as always (its source is recorded as it was)
        _lean(modules, {"sessiond.ctl.parsing"}, allowed=("pathlib", "argparse", "gettext"))

        done, modules = _imports(d, "ping")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("sessiond ")
        assert "1 sessions" in done.stdout
        _lean(modules, set())

        done, modules = _imports(d, "send", "docs", "hello")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("sent to docs (seq ")
        _lean(modules, set())

        done, modules = _imports(d, "ps")
        assert done.returncode == 0, done.stderr
        assert "docs" in done.stdout
        # "3 s ago": a relative time needs datetime, and only then
        _lean(
            modules,
            {"sessiond.ctl.ps", "sessiond.ctl.answers", "sessiond.listing"},
            allowed=("datetime",),
        )

        done, modules = _imports(d, "show", "docs")
        assert done.returncode == 0, done.stderr
        assert "session: docs" in done.stdout
        own = {"sessiond.ctl.detail", "sessiond.ctl.answers", "sessiond.describe"}
        _lean(modules, own, allowed=("datetime",))

        done, modules = _imports(d, "approve", "docs")  # nothing pending: the daemon says so
        assert done.returncode not in (0, 2, 3, 70), done.stderr
        assert "sessionctl: " in done.stderr
        _lean(modules, {"sessiond.ctl.answers", "sessiond.ctl.parsing"}, ("argparse", "gettext"))

        # with an option, argparse reads the line (its parser and that command's alone)
        done, modules = _imports(d, "send", "docs", "hi", "--from", "ann")
        assert done.returncode == 0, done.stderr
        _lean(modules, {"sessiond.ctl.parsing"}, allowed=("argparse", "gettext"))

        # a name that is no session: the daemon's answer and a did-you-mean (difflib,
        # only now), as before
        done, modules = _imports(d, "send", "dosc", "hello")
        assert done.returncode == 4
        assert "did you mean 'docs'?" in done.stderr
        assert "orjson" not in modules
        assert "pydantic" not in modules


def test_an_argument_that_is_not_text_is_refused_clearly() -> None:
    """Bytes of an argument that are not UTF-8 (a lone surrogate to Python) were a
    traceback from orjson; now an invalid-input error (exit 5) that says what."""
    with running() as d:
        d.write_spec("docs", 'name = "docs"\n')
        d.ctl("create", str(d.root / "docs.toml"), check=True)
        before = d.json("show", "docs")["seq"]
        done = subprocess.run(
            [SESSIONCTL, "send", "docs", b"caf\xe9".decode(errors="surrogateescape")],
            env=d.env,
            capture_output=True,
            text=True,
            timeout=HANG,
            check=False,
        )
        assert done.returncode == 5, done.stderr
        assert "Traceback" not in done.stderr
        assert "bytes that are not UTF-8 text (\\xe9)" in done.stderr
        assert d.json("show", "docs")["seq"] == before  # nothing was sent


def test_the_plain_frame_is_the_orjson_frame() -> None:
    """What sessionctl writes with the standard library's json is byte for byte what
    orjson writes, for what a command line holds."""
    for message in (
        {"id": 1, "method": "send", "params": {"to": "docs", "text": 'héllo ☃ 🎉\n\t"q"\\'}},
        {"id": 2, "method": "ps", "params": {"state": [], "all": True, "footer": True}},
        {"id": 3, "method": "fork", "params": {"at": None, "keep": -4, "x": [1, [2, {}]]}},
        {"id": 4, "method": "x", "params": {"ctl": "\x00\x1f\x7f\u2028", "big": 2**62}},
    ):
        assert plain_encode(message) == encode(message)
    with pytest.raises(RemoteError) as refused:
        plain_encode({"text": "\udcff"})
    assert refused.value.exit_code == 5


@pytest.mark.parametrize("command", sorted(PLAIN))
def test_a_plain_command_line_is_read_as_argparse_reads_it(command: str) -> None:
    words = [command, *(f"word {n}" for n in range(len(PLAIN[command][0])))]
    fast = plain(words)
    assert fast is not None
    whole = parser().parse_command_line(words)
    assert {k: v for k, v in vars(fast).items() if k != "fn"} == {
        k: v for k, v in vars(whole).items() if k != "fn"
    }
    assert fast.fn.__qualname__ == whole.fn.__qualname__
    # anything more (an option, a word too many or too few) is argparse's to read
    for other in ([*words, "--json"], [*words, "x"], words[:-1] if len(words) > 1 else ["-h"]):
        assert plain(other) is None


def test_one_commands_parser_is_that_command_of_the_whole_parser() -> None:
    whole = parser().commands()
    owned = [c for names in MODULE_COMMANDS.values() for c in names]
    assert set(owned) <= set(whole), "MODULE_COMMANDS names a command no module adds"
    for name, full in whole.items():
        lean = parser(name).commands()
        assert name in lean, f"{name}: MODULE_COMMANDS does not say which module adds it"
        # (check and schema come together: offline adds them to the subparsers itself)
        group = next((names for names in MODULE_COMMANDS.values() if name in names), (name,))
        assert set(lean) <= set(group), f"{name}: its parser holds others: {sorted(lean)}"
        assert lean[name].format_help() == full.format_help()
    assert parser("").commands() == {}


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["ping"], "ping"),
        (["--json", "ps", "--all"], "ps"),
        (["--socket", "ps", "ping"], "ping"),  # a socket named "ps"
        (["--sock", "/s", "send", "x", "y"], "send"),  # argparse takes the abbreviation
        (["--socket=/s", "show", "x"], "show"),
        (["--", "ping"], "ping"),
        (["--version"], None),
        (["-h"], None),
        ([], None),
    ],
)
def test_the_command_is_read_before_parsing(argv: list[str], word: str | None) -> None:
    assert command_word(argv, ("--socket",)) == word


@pytest.mark.parametrize(
    "argv",
    [
        ["ping"],
        ["--json", "ps", "--state", "blocked,ready", "--sort", "name", "-a"],
        ["send", "x", "hi", "--from", "me", "--json"],
        ["log", "x", "--since", "-1h", "-n", "5", "-o", "cat"],
        ["resolve", "x", "--rerun", "--by", "ann"],
        ["top", "--agent", "a"],
        ["--socket", "/s", "fork", "x", "--as", "y", "--at", "3"],
    ],
)
def test_a_command_line_parses_the_same_with_its_parser_alone(argv: list[str]) -> None:
    from sessiond.ctl import command_line

    lean_parser, lean = command_line(argv)
    if lean_parser is not None:  # else a plain one (above)
        assert lean_parser.commands().keys() == {lean.command}  # parsed by its own alone
    whole = parser().parse_command_line(argv)
    assert {k: v for k, v in vars(lean).items() if k != "fn"} == {
        k: v for k, v in vars(whole).items() if k != "fn"
    }
    assert lean.fn.__qualname__ == whole.fn.__qualname__
