"""What users of systemctl and journalctl expect of sessionctl (docs/design.md
section 3 and 11): completion from the parser with session names, man pages
from the parsers, `cat`, `check` (the errors `create` gives), `schema`; and
`sessionctl ps` still loads none of it."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import orjson

from sessiond.manpages import pages
from tests.e2e.harness import BIN, SESSIONCTL, running, short_dir

ROOT = Path(__file__).parents[2]
GOOD = 'name = "tidy"\ngoal = "keep it tidy"\n[run]\nexec = ["true"]\ncwd = "{ws}"\n'
BAD = [
    'name = "tidy"\n[run]\nexec = ["true"]\nbogus = 1\n',  # an unknown key
    'name = "Bad Name"\n',  # a bad name
    'name = "tidy"\n[run]\nexec = ["true"]\ncwd = "/no/such/folder"\n',  # no workspace
    "name = \n",  # not TOML
]


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SESSIONCTL, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_check_refuses_what_create_refuses_in_the_same_words() -> None:
    folder = short_dir()
    good = folder / "good.toml"
    good.write_text(GOOD.format(ws=folder))
    checked = ctl("check", str(good))
    assert checked.returncode == 0, checked.stderr
    assert "ok" in checked.stdout
    with running() as d:
        for n, text in enumerate(BAD):
            spec = folder / f"bad{n}.toml"
            spec.write_text(text)
            offline = ctl("check", str(spec))
            created = d.ctl("create", str(spec))
            assert offline.returncode == created.returncode == 5, (offline, created)
            assert offline.stderr == created.stderr
            assert str(spec) in offline.stderr or "tidy" in offline.stderr
        assert d.json("ps") == []  # nothing was created by the refusals
        d.ctl("create", str(good), check=True)
        shown = d.ctl("cat", "tidy", check=True).stdout
        assert 'name = "tidy"' in shown
        assert 'goal = "keep it tidy"' in shown
        assert d.json("cat", "tidy")["spec"] == shown
        assert d.ctl("cat", "nobody").returncode == 4


def test_schema_describes_the_spec() -> None:
    done = ctl("schema")
    assert done.returncode == 0
    schema = orjson.loads(done.stdout)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert {"name", "run", "policy", "trigger"} <= set(schema["properties"])
    assert schema["required"] == ["name"]
    assert schema["additionalProperties"] is False  # unknown keys are refused, as create does


def test_bash_completion_offers_commands_options_and_session_names() -> None:
    script = ctl("completion", "bash").stdout
    with running() as d:
        for name in ("alpha", "beta"):
            spec = d.write_spec(name, GOOD.replace("tidy", name).format(ws=d.root))
            d.ctl("create", str(spec), check=True)

        def complete(*words: str) -> list[str]:
            line = " ".join(words)
            probe = (
                f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
                f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}; '
                '_shtab_sessionctl; printf "%s\\n" "${COMPREPLY[@]}"'
            )
            env = {**d.env, "PATH": f"{BIN}:/usr/bin:/bin"}
            done = subprocess.run(
                ["bash", "-c", probe],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            return done.stdout.split()

        assert "show" in complete("sessionctl", "sh")
        assert complete("sessionctl", "log", "--fo") == ["--follow"]
        assert sorted(complete("sessionctl", "show", "''")) == ["alpha", "beta"]
        assert complete("sessionctl", "cancel", "b") == ["beta"]


def test_zsh_completion_registers_and_offers_session_names() -> None:
    script = ctl("completion", "zsh").stdout
    assert script.startswith("#compdef sessionctl")
    assert "{-f,--follow}" in script
    folder = short_dir()
    (folder / "_sessionctl").write_text(script)
    assert subprocess.run(["zsh", "-n", str(folder / "_sessionctl")], check=False).returncode == 0
    with running() as d:
        spec = d.write_spec("gamma", GOOD.replace("tidy", "gamma").format(ws=d.root))
        d.ctl("create", str(spec), check=True)
        # loaded as `eval "$(sessionctl completion zsh)"` does; _describe (the
        # completion system's) stubbed to print what it would offer
        probe = (
            "compdef() { print compdef $* }\n"
            f'eval "$(<{folder / "_sessionctl"})"\n'
            "_describe() { print -l -- ${(P)2} }\n"
            "_sessionctl_sessions\n"
        )
        env = {**d.env, "PATH": f"{BIN}:/usr/bin:/bin"}
        done = subprocess.run(
            ["zsh", "-f", "-c", probe], capture_output=True, text=True, env=env, timeout=60,
            check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["compdef _shtab_sessionctl -N sessionctl", "gamma"]


def test_the_committed_man_pages_are_what_the_parsers_say() -> None:
    for name, text in pages().items():
        committed = (ROOT / "man" / name).read_text()
        assert committed == text, f"man/{name} is stale: run 'make man'"
    assert "\\fBnotify\\fR" in pages()["sessionctl.1"]
    assert "fsck" in pages()["sessiond.8"]


def test_every_example_of_the_man_page_parses_and_its_files_are_the_real_ones() -> None:
    """`sessionctl approve docs c3` (a usage error, exit 2) was shown as an example,
    and FILES named an events.log that no state dir holds."""
    from sessiond.ctl import parser
    from sessiond.log.store.files import LOG_NAME
    from sessiond.manpages import CTL_EXAMPLES

    for line, _ in CTL_EXAMPLES:
        for command in line.replace("\\-", "-").split("&&"):
            argv = shlex.split(command)
            assert argv[0] == "sessionctl"
            try:
                parser().parse_command_line(argv[1:])
            except SystemExit as exc:
                raise AssertionError(f"man page example {command.strip()!r}: usage error") from exc
    page = pages()["sessionctl.1"]
    assert f"append\\-only {LOG_NAME}" in page
    assert "events.log" not in page


def test_sessionctl_ps_loads_no_server_model_nor_the_new_dependencies() -> None:
    probe = (
        "import sys, orjson\n"
        "from sessiond.ctl import main\n"
        "code = main(['--socket', '/nonexistent/s.sock', 'ps'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'apprise', 'opentelemetry', 'shtab', 'google', 'structlog') "
        "or m.startswith(('sessiond.table', 'sessiond.log', 'sessiond.syscalls', "
        "'sessiond.notify', 'sessiond.otel')))\n"
        "print(orjson.dumps({'code': code, 'heavy': heavy}).decode())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    result = orjson.loads(done.stdout)
    assert result == {"code": 3, "heavy": []}


def test_man_pages_have_every_section_and_no_bare_dash() -> None:
    for name, text in pages().items():
        headings = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith(".SH ")]
        for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "FILES", "ENVIRONMENT",
                        "SIGNALS", "EXIT STATUS", "EXAMPLES"):  # fmt: skip
            assert section in headings, (name, section)
        assert "\\-" not in text.splitlines(), f"{name}: a description that is a bare '-'"
        assert "docs/design.md" not in text.split(".SH EXAMPLES")[1]
