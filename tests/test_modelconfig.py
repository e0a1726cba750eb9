"""The gateway's configuration: providers with keys by reference only, a loopback
listener, a spec's [model] allow; and a run's environment with no provider key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessiond.config import BadConfig, load_config
from sessiond.modelconfig import ModelConfig, ProviderConfig
from sessiond.runs.modelenv import model_env

PROVIDER = """
[[model.provider]]
name = "a"
kind = "anthropic"
base_url = "https://api.example.test"
models = ["claude-*"]
{extra}
"""


def config(tmp_path: Path, text: str) -> ModelConfig:
    path = tmp_path / "sessiond.toml"
    path.write_text(text)
    return load_config(path, env={}, state_dir=tmp_path / "state").model


@pytest.mark.parametrize("inline", ["key", "api_key", "token"])
def test_a_key_written_inline_is_refused_naming_the_reference(tmp_path: Path, inline: str) -> None:
    with pytest.raises(BadConfig, match=r"never written in the configuration.*key_env"):
        config(tmp_path, PROVIDER.format(extra=f'{inline} = "sk-1234"'))


@pytest.mark.parametrize(
    "url", ["https://user:sk-1234@api.example.test", "https://api.example.test/v1?key=sk-1234"]
)
def test_a_key_written_in_the_base_url_is_refused(tmp_path: Path, url: str) -> None:
    # sessionctl models shows the base_url, and errors name it: no key may ride in it
    with pytest.raises(BadConfig, match=r"credentials or a query.*key_env"):
        config(tmp_path, PROVIDER.format(extra="").replace("https://api.example.test", url))


def test_bad_providers_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BadConfig, match="not both"):
        config(tmp_path, PROVIDER.format(extra='key_env = "K"\nkey_file = "k"'))
    with pytest.raises(BadConfig, match="http"):
        config(tmp_path, PROVIDER.format(extra="").replace("https://api.example.test", "ftp://x"))
    with pytest.raises(BadConfig, match="loopback"):
        config(tmp_path, '[model]\nlisten = "0.0.0.0:8080"\n')
    with pytest.raises(BadConfig, match="same name"):
        config(tmp_path, PROVIDER.format(extra="") * 2)


def test_a_key_file_is_taken_from_the_files_folder_and_read_when_used(tmp_path: Path) -> None:
    model = config(tmp_path, PROVIDER.format(extra='key_file = "keys/a.key"'))
    provider = model.provider_for("claude-x")
    assert provider is not None
    assert provider.key_file == tmp_path.resolve() / "keys" / "a.key"
    with pytest.raises(KeyError, match="cannot read"):
        provider.key({})
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "a.key").write_text("sk-from-file\n")
    assert provider.key({}) == "sk-from-file"
    assert model.provider_for("gpt-4") is None
    assert model.key_files() == [str(tmp_path.resolve() / "keys" / "a.key")]


def test_a_runs_environment_holds_no_provider_key() -> None:
    model = ModelConfig(
        provider=[
            ProviderConfig(
                name="a", kind="anthropic", base_url="http://x", models=["c*"], key_env="MY_KEY"
            ),
        ]
    )
    env = {
        "MY_KEY": "sk-secret-value-1",
        "ANTHROPIC_API_KEY": "sk-secret-value-1",
        "COPY": "prefix sk-secret-value-1 suffix",
        "OPENAI_API_KEY": "something else",
        "PATH": "/bin",
    }
    model_env(
        env,
        model,
        "http://127.0.0.1:9",
        {"MY_KEY": "sk-secret-value-1"},
        session="s",
        run="r2",
        token="tok",
    )
    assert env == {
        "PATH": "/bin",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9/run/s/r2",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/run/s/r2/v1",
        "ANTHROPIC_API_KEY": "tok",
        "OPENAI_API_KEY": "tok",
    }


def test_a_program_cannot_create_a_session_allowed_more_models(tmp_path: Path) -> None:
    from sessiond.table.policy import widening
    from sessiond.table.spec import parse_spec

    def spec(allow: str) -> Any:
        return parse_spec(f'name = "x"\n[model]\nallow = {allow}\n', base=tmp_path)

    assert widening(spec('["claude-haiku*"]'), spec('["claude-haiku*", "gpt-4o"]')) == []
    problems = widening(spec('["claude-*"]'), spec('["claude-haiku*"]'))
    assert problems == ["it may use models claude-* ([model] allow), this one not"]
