"""README's "Models" section: its configuration is one the daemon takes as written
(both providers, keys by reference, limits, prices, an agent's budget), and its
spec one a session takes (the models it may use, every budget key)."""

from __future__ import annotations

import re
from pathlib import Path

from sessiond.config import load_config
from sessiond.table.spec import parse_spec

README = Path(__file__).parents[1] / "README.md"


def _blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("\n## Models\n") : text.index("\n## The daemon\n")]
    return re.findall(r"```toml\n(.*?)```", section, re.S)


def test_the_models_configuration_is_one_the_daemon_takes(tmp_path: Path) -> None:
    config, _ = _blocks()
    (tmp_path / "sessiond.toml").write_text(config)
    model = load_config(tmp_path / "sessiond.toml", env={}).model
    anthropic, openai = model.provider
    assert (anthropic.kind, anthropic.key_env) == ("anthropic", "ANTHROPIC_API_KEY")
    assert (openai.kind, str(openai.key_file)) == ("openai", "/etc/sessiond/openai.key")
    assert (anthropic.concurrency, anthropic.rpm, anthropic.tpm) == (8, 1000, 400000)
    assert anthropic.limits["claude-haiku-4-5*"].concurrency == 4
    assert (anthropic.price_in, anthropic.price_out, openai.price_in) == (3.0, 15.0, 1.25)
    assert model.provider_for("claude-sonnet-4-5") is anthropic
    assert model.provider_for("gpt-6.1-sol") is openai


def test_the_models_spec_is_one_a_session_takes(tmp_path: Path) -> None:
    _, spec_text = _blocks()
    spec = parse_spec(spec_text, base=tmp_path)
    assert spec.model.allows("claude-sonnet-4-5")
    assert spec.model.allows("gpt-6.1-sol")
    assert not spec.model.allows("gpt-6.1-terra")
    assert (spec.budget.tokens_per_turn, spec.budget.cost_usd_per_day) == (500000, 10.0)
