"""``[web]``: where the web console listens, and what makes listening safe.

It is apart from sessiond.config so the console's rules read on their own. The
console is off unless ``listen`` is set. A listener off loopback carries login
cookies and approvals over the network, so it is refused unless the traffic is
encrypted: by the daemon itself (``tls_cert`` and ``tls_key``) or by a reverse
proxy the operator declares (``behind_proxy = true``, docs/web.md).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

DEFAULT_PORT = 8765


def split_listen(listen: str) -> tuple[str, int]:
    """'127.0.0.1:8765' -> ('127.0.0.1', 8765); '[::1]:8765' -> ('::1', 8765)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host:
        raise ValueError(f"write listen as HOST:PORT, e.g. '127.0.0.1:{DEFAULT_PORT}'")
    host = host.removeprefix("[").removesuffix("]")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"the port of {listen!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"the port of {listen!r} is not between 0 and 65535")
    return host, number


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


class WebConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # HOST:PORT, e.g. "127.0.0.1:8765"; None: no web console. Port 0 picks a free one.
    listen: str | None = None
    # The address people reach the console at (links in `sessionctl web` and in
    # notices); default: http(s)://listen.
    public_url: str | None = None
    # TLS served by the daemon itself: a PEM certificate chain and its key.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # A reverse proxy in front terminates TLS (docs/web.md): the daemon listens
    # in plain HTTP off loopback only when this says so.
    behind_proxy: bool = False

    @field_validator("listen")
    @classmethod
    def _listen(cls, listen: str | None) -> str | None:
        if listen is not None:
            split_listen(listen)
        return listen

    @field_validator("public_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"public_url must start with http:// or https:// (got {url!r})")
        return url.rstrip("/") if url else url

    @model_validator(mode="after")
    def _safe(self) -> WebConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both or neither")
        if self.listen is None:
            return self
        host, _ = split_listen(self.listen)
        if not is_loopback(host) and self.tls_cert is None and not self.behind_proxy:
            raise ValueError(
                f"listen = {self.listen!r} is off loopback, where logins and approvals "
                "would cross the network in clear text: set tls_cert and tls_key, or put "
                "the console behind a TLS reverse proxy and set behind_proxy = true "
                "(docs/web.md), or listen on 127.0.0.1"
            )
        return self

    @property
    def loopback(self) -> bool:
        return self.listen is not None and is_loopback(split_listen(self.listen)[0])

    @property
    def local_only(self) -> bool:
        """Only this machine reaches the listener: loopback, no proxy in front and
        no public URL. Then /metrics answers without a login."""
        return self.loopback and not self.behind_proxy and self.public_url is None

    def link_base(self) -> str | None:
        """Where links in notices point: ``public_url``, else the listener's own
        address (none for a console that is off or on a port picked at start)."""
        if self.public_url or self.listen is None:
            return self.public_url
        return None if split_listen(self.listen)[1] == 0 else self.url()

    def url(self, port: int | None = None) -> str:
        """Where people open the console (``port``: the one bound, for port 0)."""
        if self.public_url:
            return self.public_url
        assert self.listen is not None
        host, configured = split_listen(self.listen)
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.tls_cert is not None else "http"
        return f"{scheme}://{host}:{port or configured}"
