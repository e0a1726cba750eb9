"""Session specs refused or accepted as docs/spec.md says: numbers that are not
finite, and paths written absolute (docs/design.md section 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.table.spec import (
    BadSpec,
    GitTriggerSpec,
    WatchTriggerSpec,
    parse_spec,
    spec_to_toml,
)

RUN = '[run]\nexec = ["true"]\ncwd = "ws"\n'


def refusal(text: str, base: Path) -> str:
    with pytest.raises(BadSpec) as caught:
        parse_spec('name = "s"\n' + text, base=base, source="s.toml")
    return str(caught.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (RUN + "timeout = nan\n", "run.timeout"),
        (RUN + "timeout = inf\n", "run.timeout"),
        (RUN + "timeout = -inf\n", "run.timeout"),
        ("[limits]\ninterval = nan\n", "limits.interval"),
        ("[limits]\ncool_down = inf\n", "limits.cool_down"),
        ("[policy]\napproval_ttl = nan\n", "policy.approval_ttl"),
        ('[[trigger]]\ntype = "every"\ninterval = nan\n', "trigger[0].interval"),
        ('[[trigger]]\ntype = "every"\ninterval = inf\n', "trigger[0].interval"),
        ('[[trigger]]\ntype = "watch"\npaths = ["a"]\ndebounce = inf\n', "trigger[0].debounce"),
        ('[[trigger]]\ntype = "watch"\npaths = ["a"]\ndebounce = nan\n', "trigger[0].debounce"),
        (
            '[[trigger]]\ntype = "cron"\nschedule = "0 9 * * *"\njitter = nan\n',
            "trigger[0].jitter",
        ),
    ],
)
def test_a_duration_that_is_not_finite_is_refused_naming_the_key(
    text: str, key: str, tmp_path: Path
) -> None:
    (tmp_path / "ws").mkdir()
    message = refusal(text, tmp_path)
    bad = text.rsplit("= ", 1)[1].strip()
    assert message.startswith(f"s.toml: {key}: {bad} is not a duration: write a finite number")


@pytest.mark.parametrize(
    "value",
    ['"nan"', '"inf"', '"1e999s"', f'"{"9" * 400}s"', "1e300", '"36501d"'],
)
def test_a_duration_written_as_text_or_too_long_to_count_is_refused(
    value: str, tmp_path: Path
) -> None:
    (tmp_path / "ws").mkdir()
    message = refusal(RUN + f"timeout = {value}\n", tmp_path)
    assert message.startswith("s.toml: run.timeout: ")
    assert "duration" in message


def test_other_numbers_that_are_not_finite_are_refused(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    assert refusal(RUN + "retries = nan\n", tmp_path).startswith("s.toml: run.retries: ")
    assert refusal("priority = inf\n", tmp_path).startswith("s.toml: priority: ")
    assert refusal("[budget]\ntokens = nan\n", tmp_path).startswith("s.toml: budget.tokens: ")


INSIDE = """[run]
exec = ["true"]
cwd = "ws"
writes = ["{ws}/out/report.md", "{ws}/a/../b.txt", "rel.txt"]
[bind]
files = ["{ws}/rates.csv"]
[[trigger]]
type = "watch"
paths = ["{ws}/data/*.csv"]
exclude = ["{ws}/data/tmp*"]
[[trigger]]
type = "git"
repo = "."
paths = ["{ws}/src/**"]
"""


def test_absolute_paths_inside_the_workspace_are_stored_relative(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = parse_spec('name = "s"\n' + INSIDE.format(ws=ws), base=tmp_path)
    assert spec.run is not None
    assert spec.run.writes == ["out/report.md", "b.txt", "rel.txt"]
    assert spec.bind.files == ["rates.csv"]
    watch, git = spec.trigger
    assert isinstance(watch, WatchTriggerSpec)
    assert isinstance(git, GitTriggerSpec)
    assert watch.paths == ["data/*.csv"]
    assert watch.exclude == ["data/tmp*"]
    assert git.paths == ["src/**"]
    stored = spec_to_toml(spec)
    assert str(ws) + "/" not in stored  # only run.cwd and the repo stay absolute
    assert parse_spec(stored, base=Path("/")) == spec


def test_an_absolute_path_through_a_symlinked_workspace_counts_as_inside(
    tmp_path: Path,
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "ws").symlink_to(tmp_path / "real")
    spec = parse_spec(
        f'name = "s"\n{RUN}writes = ["{tmp_path}/ws/x", "{tmp_path}/real/y"]\n', base=tmp_path
    )
    assert spec.run is not None
    assert spec.run.writes == ["x", "y"]


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('[run]\nexec = ["true"]\ncwd = "ws"\nwrites = ["{p}"]\n', "run.writes"),
        ('[run]\nexec = ["true"]\ncwd = "ws"\n[bind]\nfiles = ["{p}"]\n', "bind.files"),
        (
            '[run]\nexec = ["true"]\ncwd = "ws"\n[[trigger]]\ntype = "watch"\npaths = ["{p}"]\n',
            "trigger[0].paths",
        ),
        (
            '[run]\nexec = ["true"]\ncwd = "ws"\n[[trigger]]\ntype = "git"\npaths = ["{p}"]\n',
            "trigger[0].paths",
        ),
    ],
)
def test_an_absolute_path_outside_the_workspace_is_refused_naming_both(
    table: str, key: str, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for outside in ("/etc/passwd", f"{ws}/../elsewhere/x", f"{ws}-sibling/x"):
        message = refusal(table.format(p=outside), tmp_path)
        assert message.startswith(f"s.toml: {key}: {outside!r} is outside the workspace {ws}")


def test_secrets_are_references_stored_as_such(tmp_path: Path) -> None:
    text = (
        'name = "s"\n' + RUN + 'secrets = { API_KEY = { env = "PAYROLL_API_KEY" }, '
        'DB_PASS = { file = "db.pass" } }\n'
    )
    spec = parse_spec(text, base=tmp_path)
    assert spec.run is not None
    assert spec.run.secrets["API_KEY"].env == "PAYROLL_API_KEY"
    # from the spec's folder, made absolute but not resolved (mounted secrets move)
    assert spec.run.secrets["DB_PASS"].file == str(tmp_path / "db.pass")
    assert parse_spec(spec_to_toml(spec), base=Path("/")) == spec


@pytest.mark.parametrize(
    ("secrets", "says"),
    [
        ('{ A = "sk-literal" }', "A: a secret is named by reference, never written in the spec"),
        ('{ A = { env = "X", file = "/f" } }', "run.secrets.A: a secret is either"),
        ("{ A = {} }", "run.secrets.A: a secret is either"),
        ('{ A = { env = "NOT-A-NAME" } }', "env 'NOT-A-NAME' is not an environment variable"),
        ('{ "9A" = { env = "X" } }', "'9A' is not an environment variable name"),
        ('{ SESSIOND_TOKEN = { env = "X" } }', "SESSIOND_TOKEN: SESSIOND_* variables are set"),
    ],
)
def test_a_bad_secret_is_refused_naming_it(tmp_path: Path, secrets: str, says: str) -> None:
    assert says in refusal(RUN + f"secrets = {secrets}\n", tmp_path)


def test_a_name_in_both_env_and_secrets_is_refused(tmp_path: Path) -> None:
    text = RUN + 'env = { A = "1" }\nsecrets = { A = { env = "X" } }\n'
    assert "A: named in both env and secrets" in refusal(text, tmp_path)


def test_a_redact_pattern_that_matches_the_empty_string_is_refused(tmp_path: Path) -> None:
    said = refusal('redact = ["sk-[a-z]*", "x*"]\n', tmp_path)
    assert "'x*' matches the empty string" in said
