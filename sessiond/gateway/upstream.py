"""The gateway's client of the upstreams: one aiohttp session on the daemon's loop.

A call goes to the provider that serves its model, with the provider's key (read
by reference when the call is sent: sessiond.modelconfig) in the header that
provider's API takes. The run's own headers are never forwarded but for the
ones an API needs to mean the same thing (Anthropic's version and betas): the
run's token stays in the daemon.
"""

from __future__ import annotations

import aiohttp

from sessiond.modelconfig import ProviderConfig

PATHS = {"messages": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
KIND_OF = {"messages": "anthropic", "chat": "openai", "responses": "openai"}
# the run's headers that travel upstream (lower case)
PASSED = ("anthropic-version", "anthropic-beta", "openai-beta")


class Upstreams:
    """Sends calls upstream; ``close()`` at the daemon's end."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # no total timeout: a long stream is fine; a dead upstream is noticed by
            # the connect and read timeouts
            timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_read=600)
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                timeout=timeout, connector=connector, auto_decompress=True
            )
        return self._session

    @staticmethod
    def url(provider: ProviderConfig, api: str) -> str:
        # base_url is the API's root; ".../v1" (as the SDKs write it) is taken as it
        base = provider.base_url.removesuffix("/v1")
        return base + PATHS[api]

    async def send(
        self, provider: ProviderConfig, api: str, body: bytes, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """The upstream's response, at its headers (the caller reads and releases it).
        Raises KeyError where the provider's key cannot be read."""
        key = provider.key(self.env)
        out = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        out.update({k: v for k, v in headers.items() if k.lower() in PASSED})
        if provider.kind == "anthropic":
            out.setdefault("anthropic-version", "2023-06-01")
            if key is not None:
                out["x-api-key"] = key
        elif key is not None:
            out["Authorization"] = f"Bearer {key}"
        return await self._client().post(self.url(provider, api), data=body, headers=out)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
