"""sessiond.runs.secrets: reading [run] secrets at a start, and why one cannot be."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.runs.secrets import SECRET_FILE_LIMIT, SecretMissing, resolve
from sessiond.table.spec import SessionSpec, parse_spec


def spec(tmp_path: Path, secrets: str) -> SessionSpec:
    text = f'name = "s"\n[run]\nexec = ["true"]\nsecrets = {secrets}\n'
    return parse_spec(text, base=tmp_path)


def test_values_from_the_daemons_environment_and_files(tmp_path: Path) -> None:
    (tmp_path / "p").write_text("pass word\n")
    s = spec(tmp_path, '{ K = { env = "SRC" }, P = { file = "p" } }')
    assert resolve(s, {"SRC": "k-value"}) == {"K": "k-value", "P": "pass word"}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "secret P: the file {p} is empty"),
        (b"\n", "secret P: the file {p} is empty"),
        (b"a\x00b", "holds a NUL character"),
        (b"\xff\xfe", "secret P: the file {p} is not UTF-8 text"),
        (b"x" * (SECRET_FILE_LIMIT + 1), "is over 65536 bytes"),
    ],
)
def test_a_file_that_cannot_be_a_secret_is_refused(
    tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "p"
    path.write_bytes(content)
    with pytest.raises(SecretMissing) as caught:
        resolve(spec(tmp_path, '{ P = { file = "p" } }'), {})
    assert says.format(p=path) in str(caught.value)


def test_a_missing_variable_or_file_names_the_secret_and_where(tmp_path: Path) -> None:
    with pytest.raises(SecretMissing) as caught:
        resolve(spec(tmp_path, '{ K = { env = "NOPE" } }'), {})
    assert "secret K: the daemon's environment has no variable NOPE" in str(caught.value)
    with pytest.raises(SecretMissing) as caught:
        resolve(spec(tmp_path, '{ P = { file = "gone" } }'), {})
    assert f"secret P: cannot read the file {tmp_path / 'gone'}: No such file" in str(caught.value)


def test_a_fifo_or_a_folder_is_refused_without_waiting(tmp_path: Path) -> None:
    """A FIFO (a run can make one where its workspace holds a secret file) would
    hold a blocking open until a writer came: the daemon's loop with it."""
    import os

    os.mkfifo(tmp_path / "p")
    (tmp_path / "d").mkdir()
    for name in ("p", "d"):
        with pytest.raises(SecretMissing, match="is not a regular file"):
            resolve(spec(tmp_path, f'{{ P = {{ file = "{name}" }} }}'), {})
