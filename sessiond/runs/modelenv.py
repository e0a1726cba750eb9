"""What a run's environment says of the model gateway, and what it must never hold.

A run gets the gateway's address for it and its run token as the API key:
``ANTHROPIC_BASE_URL`` (``…/run/<session>/<run>``), ``OPENAI_BASE_URL`` (the same
with ``/v1``, as the OpenAI SDKs take it), ``ANTHROPIC_API_KEY`` and
``OPENAI_API_KEY``. And no provider key reaches it: the variables the providers'
keys are read from are taken out of the environment it inherits, and so is any
variable holding a key's value under another name (the daemon's own environment,
the profile's, the spec's).
"""

from __future__ import annotations

from sessiond.modelconfig import ModelConfig

KEY_VARS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_AUTH_TOKEN")


def provider_keys(config: ModelConfig, daemon_env: dict[str, str]) -> set[str]:
    """The providers' keys as the daemon reads them now (those it can read)."""
    found = set()
    for provider in config.provider:
        try:
            key = provider.key(daemon_env)
        except KeyError:
            continue
        if key and len(key) >= 8:  # a value that short would match anything
            found.add(key)
    return found


def scrub(env: dict[str, str], config: ModelConfig, daemon_env: dict[str, str]) -> None:
    """Take every provider key out of ``env`` (in place)."""
    names = {p.key_env for p in config.provider if p.key_env is not None}
    keys = provider_keys(config, daemon_env)
    for name, value in list(env.items()):
        if name in names or any(key in value for key in keys):
            del env[name]


def model_env(
    env: dict[str, str],
    config: ModelConfig,
    gateway: str | None,
    daemon_env: dict[str, str],
    *,
    session: str,
    run: str,
    token: str,
) -> None:
    """Set the gateway's variables in a run's ``env`` (in place), once no key is left."""
    scrub(env, config, daemon_env)
    if gateway is None or not config.enabled:
        return
    for name in KEY_VARS:
        env.pop(name, None)
    base = f"{gateway}/run/{session}/{run}"
    env["ANTHROPIC_BASE_URL"] = base
    env["OPENAI_BASE_URL"] = f"{base}/v1"
    env["ANTHROPIC_API_KEY"] = token
    env["OPENAI_API_KEY"] = token
