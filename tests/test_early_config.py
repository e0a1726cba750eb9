"""The early server's reading of the configuration (sessiond.daemon.early) is the
validated one's wherever it is used, and it is not used where it could differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiond.config import load_config
from sessiond.daemon import cli, early
from sessiond.daemon.early import agrees, early_config
from sessiond.ipc.early import DYNAMIC_UIDS
from sessiond.log.store import files
from sessiond.sandboxconfig import DEFAULT_DYNAMIC_UIDS, parse_uid_range
from sessiond.table import indexfile

CASES = [
    ("", {}, None, None),
    ('state_dir = "st"\nsocket = "run/s.sock"\n', {}, None, None),
    ('state_dir = "/abs/st"\n[run]\nsandbox = "off"\n', {}, None, None),
    ("clock_offset = 86400\n", {"SESSIOND_STATE_DIR": "rel/env-st"}, None, None),
    ("clock_offset = 1.5\n", {"SESSIOND_SOCKET": "/x/env.sock"}, None, None),
    ('state_dir = "st"\n', {"SESSIOND_STATE_DIR": "/e"}, Path("flag-st"), Path("f.sock")),
    ('[access]\nusers = []\n[cluster]\nnode = "n1"\n', {}, None, None),
]


class FakeEarly:
    def __init__(self, config: object) -> None:
        self.config = config


@pytest.mark.parametrize(("text", "env", "state_dir", "sock"), CASES)
def test_the_early_reading_agrees_with_the_validated_configuration(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    env: dict[str, str],
    state_dir: Path | None,
    sock: Path | None,
) -> None:
    monkeypatch.chdir(tmp_path)  # relative flags: from the daemon's working folder
    conf = tmp_path / "conf" / "sessiond.toml"
    conf.parent.mkdir()
    conf.write_text(text)
    full = load_config(conf, env=env, state_dir=state_dir, socket=sock)
    mine = early_config(conf, env, state_dir, sock)
    assert mine is not None
    assert (mine.state_dir, mine.socket) == (full.state_dir, full.socket)
    assert mine.sandbox == (full.run.sandbox == "on")
    assert mine.clock_offset == full.clock_offset
    assert agrees(FakeEarly(mine), full)  # type: ignore[arg-type]  # what agrees reads
    # and with the file named by SESSIOND_CONFIG instead of --config
    by_env = early_config(None, {**env, "SESSIOND_CONFIG": str(conf)}, state_dir, sock)
    assert by_env == mine


@pytest.mark.parametrize(
    "text",
    [
        '[access]\nusers = ["root"]\n',
        '[access]\ngroups = ["root"]\n',
        '[run]\nuser = "root"\n',
        '[run]\ndynamic_uids = "600000-600100"\n',
        '[cluster]\ndsn = "postgresql://x/y"\n',
        'state_dir = "unterminated\n',
        "state_dir = 3\n",
        'clock_offset = "1"\n',
        '[run]\nsandbox = "maybe"\n',
        "access = 1\n",
    ],
)
def test_the_early_server_stays_closed_where_its_reading_could_differ(
    tmp_path: Path, text: str
) -> None:
    conf = tmp_path / "sessiond.toml"
    conf.write_text(text)
    assert early_config(conf, {}, None, None) is None


def test_a_configuration_that_differs_is_caught_before_going_on(tmp_path: Path) -> None:
    conf = tmp_path / "sessiond.toml"
    conf.write_text('state_dir = "a"\n')
    mine = early_config(conf, {}, None, None)
    assert mine is not None
    other = load_config(conf, env={}, state_dir=tmp_path / "b")
    assert not agrees(FakeEarly(mine), other)  # type: ignore[arg-type]


def test_the_constants_the_early_path_copies_agree_with_their_sources() -> None:
    assert parse_uid_range(DEFAULT_DYNAMIC_UIDS) == DYNAMIC_UIDS
    assert (indexfile.LOG_NAME, indexfile.SPEC_NAME) == (files.LOG_NAME, files.SPEC_NAME)


def test_the_early_path_imports_no_pydantic_and_no_structlog() -> None:
    """What runs before the early server answers: the command, its reading of
    the configuration, the index and the server (sessiond.daemon.cli imports
    the daemon itself only after)."""
    code = (
        "import sys, sessiond.daemon.cli, sessiond.daemon.early\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'pydantic_core', 'structlog', 'uvloop', 'asyncio'))\n"
        "print(heavy)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"},
    )  # fmt: skip
    assert done.stdout.strip() == "[]"


# modules the early path once imported and needs not: the command line's parser
# (the plain daemon's argv is read without it)
# typing, and tomllib for a plain configuration: their imports cost the first
# answer more than what they give it (sessiond.daemon.early, sessiond.ipc.early)
NOT_EARLY = ("argparse", "gettext", "typing", "tomllib")


def test_the_early_path_imports_no_argument_parser() -> None:
    """The command as the daemon's start runs it (the plain argv): up to the
    early server, nothing of NOT_EARLY (sessiond.daemon.cli reads the argv)."""
    code = (
        "import sys\n"
        "from sessiond.daemon import cli\n"
        "assert cli._plain(['--config', 'c.toml', '--socket', 's']) is not None\n"
        "import sessiond.daemon.early\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {NOT_EARLY!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"},
    )  # fmt: skip
    assert done.stdout.strip() == "[]"


ARGVS = [
    [],
    ["--config", "c.toml"],
    ["--config", "c.toml", "--state-dir", "st", "--socket", "run/s.sock"],
    ["--socket", "/abs/s.sock", "--config", "/abs/c.toml"],
    ["--state-dir", "fsck"],
    ["--config", "a b.toml"],
]


@pytest.mark.parametrize("argv", ARGVS)
def test_the_plain_argv_is_read_as_argparse_reads_it(argv: list[str]) -> None:
    flags = cli._plain(argv)
    assert flags is not None
    args = cli._parser().parse_args(argv)
    assert args.command is None
    for dest in ("config", "state_dir", "socket"):
        expected = getattr(args, dest)
        assert (Path(flags[dest]) if dest in flags else None) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["fsck", "--state-dir", "st"],
        ["db", "migrate", "--dsn", "postgresql://x/y"],
        ["--config=c.toml"],
        ["--conf", "c.toml"],  # argparse's abbreviation: its own to read
        ["--config", "a", "--config", "b"],
        ["--config", "-x"],
        ["--config", ""],
        ["--config"],
        ["--version"],
        ["--help", "x"],
    ],
)
def test_any_other_argv_goes_through_argparse(argv: list[str]) -> None:
    assert cli._plain(argv) is None


# Lines of a configuration: plain ones (read without tomllib) and ones only
# tomllib reads or refuses, mixed, so that both readings meet on every shape.
_NAMES = st.sampled_from(["state_dir", "socket", "run", "access", "sandbox", "a-b", "1", "x_2"])
_VALUES = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8).map(
        lambda s: '"' + s + '"'
    ),
    st.sampled_from(["true", "false", "0", "-0", "7", "-12", "007", "+1", "1_000", "1.5", "-",
                     "''", "'x'", '"""x"""', '"a" # c', '"a\\tb"', "[1]", "{a = 1}", "True",
                     '"a"b"', "", "2026-12-06"]),
)  # fmt: skip
_LINES = st.one_of(
    st.builds(lambda k, s, v: f"{k}{s}={s}{v}", _NAMES, st.sampled_from(["", " ", " \t"]), _VALUES),
    st.builds(lambda k: f"[{k}]", _NAMES),
    st.sampled_from(["", "  ", "# a comment", "  # é\t", "[[run]]", "[ run ]", "[a.b]",
                     "a.b = 1", '"q" = 1', "[run] # x", "=1", "[]", "x = 1\r", "\ufeffx = 1",
                     "\x01", "k =", "[run"]),
)  # fmt: skip


@given(st.lists(_LINES, max_size=8))
def test_a_plain_configuration_is_read_as_tomllib_reads_it(lines: list[str]) -> None:
    text = "\n".join(lines)
    plain = early._plain_toml(text)
    if plain is None:
        return  # tomllib's to read (or refuse): the same reading as before
    assert plain == tomllib.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        'log_format = "json"\nlog_level = "info"\n',  # the benchmark daemon's
        '# the node\nstate_dir = "/var/lib/sessiond"\n\n[run]\nsandbox = "off"\n',
        "clock_offset = 86400\n[access]\n",
    ],
)
def test_a_plain_configuration_is_read_without_tomllib(text: str) -> None:
    assert early._plain_toml(text) == tomllib.loads(text)


def test_the_early_path_imports_no_toml_parser_for_a_plain_configuration(tmp_path: Path) -> None:
    conf = tmp_path / "sessiond.toml"
    conf.write_text('log_format = "json"\nstate_dir = "st"\n[run]\nsandbox = "off"\n')
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from sessiond.daemon.early import early_config\n"
        f"mine = early_config(Path({str(conf)!r}), {{}}, None, None)\n"
        "assert mine is not None and not mine.sandbox, mine\n"
        "print(sorted(m for m in sys.modules if m.startswith('tomllib')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"},
    )  # fmt: skip
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "name"),
    [("sessiond/ipc/early.py", "EarlyConfig"), ("sessiond/table/indexfile.py", "Read")],
)
def test_the_tuples_made_without_typing_have_the_typed_fields(module: str, name: str) -> None:
    """mypy reads the NamedTuple; the early path runs a namedtuple (no typing):
    the same fields, in the same order."""
    import ast
    import importlib

    tree = ast.parse((Path(__file__).parents[1] / module).read_text())
    typed = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and node.name == name
        and any(isinstance(b, ast.Name) and b.id == "NamedTuple" for b in node.bases)
    )
    fields = [s.target.id for s in typed.body if isinstance(s, ast.AnnAssign)]  # type: ignore[union-attr]
    made = getattr(importlib.import_module(module[:-3].replace("/", ".")), name)
    assert list(made._fields) == fields


GC_PROBE = """
import gc, json, sys
from sessiond.daemon import cli
import sessiond.daemon.early as early
import sessiond.daemon.service as service
seen = {}
def open_early(*args):
    seen["open_early"] = gc.isenabled()
    return None
def run(*args, **kwargs):
    seen["run"] = gc.isenabled()
    seen["frozen"] = gc.get_freeze_count()
    return 0
def fsck(args):
    seen["fsck"] = gc.isenabled()
    return 0
early.open_early, service.run, cli._fsck = open_early, run, fsck
cli.main(sys.argv[1:])
seen["after"] = gc.isenabled()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("fsck", [False, True])
def test_the_early_path_runs_with_the_cyclic_collector_off(tmp_path: Path, fsck: bool) -> None:
    """Up to the early server, the daemon's command only imports and reads: the
    collector is off (it would only walk what is made, all kept); then what is
    alive is frozen and it is back on before the daemon's own imports. fsck, a
    command of its own, runs with it on."""
    argv = ["fsck", "--state-dir", str(tmp_path)] if fsck else ["--state-dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-c", GC_PROBE, *argv], capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"},
    )  # fmt: skip
    seen = json.loads(done.stdout)
    if fsck:
        assert seen == {"fsck": True, "after": True}
    else:
        assert seen["open_early"] is False
        assert (seen["run"], seen["after"]) == (True, True)
        assert seen["frozen"] > 0
