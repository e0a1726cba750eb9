"""``[web]``: off by default, loopback is fine, off loopback needs TLS or a proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.config import BadConfig, load_config
from sessiond.webconfig import WebConfig


def load(tmp_path: Path, text: str) -> WebConfig:
    path = tmp_path / "sessiond.toml"
    path.write_text(text)
    return load_config(path, env={}).web


def test_the_console_is_off_unless_listen_is_set(tmp_path: Path) -> None:
    assert load(tmp_path, "").listen is None


def test_loopback_listens_in_plain_http(tmp_path: Path) -> None:
    web = load(tmp_path, '[web]\nlisten = "127.0.0.1:8765"\n')
    assert web.loopback
    assert web.local_only  # /metrics without a login
    assert web.url() == "http://127.0.0.1:8765"
    assert load(tmp_path, '[web]\nlisten = "[::1]:0"\n').url(4242) == "http://[::1]:4242"


@pytest.mark.parametrize("listen", ["0.0.0.0:8765", "192.0.2.1:80", "console.example:8765"])
def test_off_loopback_without_tls_or_a_proxy_is_refused_with_what_to_do(
    tmp_path: Path, listen: str
) -> None:
    with pytest.raises(BadConfig) as refused:
        load(tmp_path, f'[web]\nlisten = "{listen}"\n')
    message = str(refused.value)
    assert "web" in message
    assert "tls_cert" in message
    assert "behind_proxy" in message
    assert "docs/web.md" in message


def test_off_loopback_with_a_declared_proxy_or_tls_is_allowed(tmp_path: Path) -> None:
    proxied = load(
        tmp_path,
        '[web]\nlisten = "0.0.0.0:8765"\nbehind_proxy = true\n'
        'public_url = "https://ops.example/sessiond/"\n',
    )
    assert not proxied.loopback
    assert not proxied.local_only
    local_proxy = load(tmp_path, '[web]\nlisten = "127.0.0.1:8765"\nbehind_proxy = true\n')
    assert local_proxy.loopback
    assert not local_proxy.local_only  # requests come through the proxy
    assert proxied.url() == "https://ops.example/sessiond"
    tls = load(tmp_path, '[web]\nlisten = "0.0.0.0:8765"\ntls_cert = "c.pem"\ntls_key = "k.pem"\n')
    assert tls.tls_cert == tmp_path / "c.pem"  # relative to the file, as other paths
    assert tls.url() == "https://0.0.0.0:8765"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('listen = "8765"', "HOST:PORT"),
        ('listen = "127.0.0.1:http"', "not a number"),
        ('listen = "127.0.0.1:70000"', "between 0 and 65535"),
        ('listen = "127.0.0.1:1"\ntls_cert = "c.pem"', "go together"),
        ('listen = "127.0.0.1:1"\npublic_url = "ops.example"', "http://"),
        ('listen = "127.0.0.1:1"\ncolour = "blue"', "unknown key"),
    ],
)
def test_a_bad_web_key_names_what_is_wrong(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(BadConfig, match=says):
        load(tmp_path, f"[web]\n{text}\n")
