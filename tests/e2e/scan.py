"""Scanning every byte a daemon wrote for a secret, in the forms it could take there.

What is scanned: every file under the state dir (logs, snapshots, artifacts,
specs, notices, leases, keys: whatever is there, gzip'd files unpacked too), the
daemon's own log lines (its stderr: what journald would keep), and any extra
text the test gathered (``/metrics``, exported traces, command output). A secret
is looked for raw, JSON-escaped, percent-encoded, in hex and in base64 (both
alphabets, at each of the three alignments it can start at in a longer value).
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from collections.abc import Iterable
from urllib.parse import quote

import orjson

from tests.e2e.harness import Daemon


def forms(secret: str) -> dict[str, bytes]:
    """Each encoding of ``secret`` a sink could hold, by name."""
    raw = secret.encode()
    out = {
        "raw": raw,
        "json": orjson.dumps(secret)[1:-1],
        "ascii-json": json.dumps(secret)[1:-1].encode(),
        "repr": repr(secret).encode()[1:-1],
        "percent": quote(secret, safe="").encode(),
        "hex": raw.hex().encode(),
    }
    for shift, skip in ((0, 0), (1, 2), (2, 3)):
        padded = b"\0" * shift + raw
        whole = len(padded) // 3 * 4  # the characters that hold only whole triples
        for name, encode in (("b64", base64.b64encode), ("b64url", base64.urlsafe_b64encode)):
            core = encode(padded)[skip:whole]
            if len(core) >= 8:
                out[f"{name}+{shift}"] = core
    return out


def _unpacked(data: bytes) -> bytes:
    if data[:2] == b"\x1f\x8b":  # a bundle, or any gzip'd file
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            return data
    return data


def written(d: Daemon) -> dict[str, bytes]:
    """Every regular file under the daemon's state dir, by its path there."""
    out = {}
    for path in sorted(d.state_dir.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(d.state_dir))] = _unpacked(path.read_bytes())
    return out


def leaks(
    d: Daemon, secrets: Iterable[str], extra: dict[str, bytes] | None = None
) -> list[tuple[str, str]]:
    """(where, which form) for each form of each secret found in what ``d`` wrote."""
    places = written(d)
    places["daemon stderr"] = b"\n".join(orjson.dumps(line) for line in d.lines)
    places.update(extra or {})
    found = []
    for secret in secrets:
        for form, needle in forms(secret).items():
            found += [(where, form) for where, data in places.items() if needle in data]
    return found


def assert_written_nowhere(
    d: Daemon, secrets: Iterable[str], extra: dict[str, bytes] | None = None
) -> dict[str, bytes]:
    """Stop the daemon (its snapshots and last writes done), then scan it all;
    returns the files scanned."""
    secrets = list(secrets)
    d.stop()
    found = leaks(d, secrets, extra)
    assert not found, f"a secret was written: {found}"
    return written(d)
