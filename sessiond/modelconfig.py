"""The model gateway's configuration: the daemon's ``[model]`` table with its
``[[model.provider]]`` upstreams, and a session spec's ``[model]`` (the models its
session may use).

A provider's key is named by reference, never written here: ``key_env`` (a variable
of the daemon's environment) or ``key_file`` (a file the daemon reads). It is read
by the daemon when it sends a call, and never enters a run: not its environment,
not a file it can read (the sandbox hides ``key_file``), not its arguments.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PROVIDER_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Limits(_Strict):
    """What an upstream allows: calls at once, requests and tokens a minute (unset: no
    limit of ours; the provider's 429s are still absorbed)."""

    concurrency: int | None = Field(default=None, ge=1)
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)


class ProviderConfig(Limits):
    """One ``[[model.provider]]``: an upstream, the models it serves (names or globs),
    its limits (the provider's as a whole, and per model in ``[model.provider.limits]``)
    and its prices in US dollars per million tokens."""

    name: str
    kind: Literal["anthropic", "openai"]
    base_url: str
    key_env: str | None = None
    key_file: Path | None = None
    models: list[str] = Field(min_length=1)
    limits: dict[str, Limits] = Field(default_factory=dict)
    price_in: float | None = Field(default=None, ge=0)
    price_out: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _no_inline_key(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for inline in ("key", "api_key", "token"):
                if inline in data:
                    raise ValueError(
                        f"{inline}: a provider's key is never written in the configuration; "
                        'name it by reference: key_env = "VARIABLE" (a variable of the '
                        'daemon\'s environment) or key_file = "/path"'
                    )
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not PROVIDER_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a provider name: use a-z, 0-9, '.', '_', '-'")
        return name

    @field_validator("base_url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        # a key in the address would be shown (sessionctl models, errors): by reference only
        if "@" in url.split("/", 3)[2] or "?" in url or "#" in url:
            raise ValueError(
                "base_url holds credentials or a query: a provider's key is never written "
                'in the configuration; name it by reference: key_env = "VARIABLE" or '
                'key_file = "/path"'
            )
        return url.rstrip("/")

    @model_validator(mode="after")
    def _one_key(self) -> ProviderConfig:
        if self.key_env is not None and self.key_file is not None:
            raise ValueError("a provider's key is key_env or key_file, not both")
        if self.key_env is not None and not ENV_NAME.fullmatch(self.key_env):
            raise ValueError(f"key_env {self.key_env!r} is not an environment variable name")
        return self

    def serves(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    def key(self, env: dict[str, str]) -> str | None:
        """The key, read now (so a rotated key is used at the next call); None when the
        provider needs none. Raises KeyError naming where it looked."""
        if self.key_env is not None:
            value = env.get(self.key_env) or os.environ.get(self.key_env)
            if not value:
                raise KeyError(f"the daemon's environment has no {self.key_env}")
            return value
        if self.key_file is not None:
            try:
                return self.key_file.read_text().strip()
            except OSError as exc:
                raise KeyError(f"cannot read {self.key_file}: {exc.strerror}") from None
        return None

    def cost(self, tokens_in: int, tokens_out: int) -> float | None:
        if self.price_in is None and self.price_out is None:
            return None
        return (tokens_in * (self.price_in or 0) + tokens_out * (self.price_out or 0)) / 1e6


class ModelConfig(_Strict):
    """The daemon's ``[model]``: where the gateway listens (loopback), the largest
    request body it takes, and the upstreams. No provider: no gateway."""

    listen: str = "127.0.0.1:0"
    max_body: int = Field(default=32 << 20, ge=1024, le=1 << 30)
    provider: list[ProviderConfig] = Field(default_factory=list)

    @field_validator("listen")
    @classmethod
    def _loopback(cls, listen: str) -> str:
        host, _, port = listen.rpartition(":")
        if host not in ("127.0.0.1", "localhost", "[::1]") or not port.isdigit():
            raise ValueError(
                f"{listen!r}: the gateway listens on loopback only, as 127.0.0.1:PORT "
                "(0: any free port); runs are its only clients"
            )
        return listen

    @model_validator(mode="after")
    def _unique(self) -> ModelConfig:
        names = [p.name for p in self.provider]
        if len(names) != len(set(names)):
            raise ValueError("two [[model.provider]] have the same name")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.provider)

    def provider_for(self, model: str) -> ProviderConfig | None:
        """The first provider serving ``model`` (in the order of the file)."""
        return next((p for p in self.provider if p.serves(model)), None)

    def key_files(self) -> list[str]:
        return [str(p.key_file) for p in self.provider if p.key_file is not None]


class ModelSpec(_Strict):
    """A session spec's ``[model]``: the models its programs may call through the
    gateway (names or globs; none unless listed), and whether a request that differs
    from the one recorded at its place in the turn is a divergence (``strict``) or
    answered from the record (the default: frameworks put timestamps in requests)."""

    allow: list[str] = Field(default_factory=list)
    strict: bool = False

    def allows(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.allow)
