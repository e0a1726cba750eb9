"""A run's program that knocks at its gateway address (a TCP connect to the host
and port of ANTHROPIC_BASE_URL) and writes ``open`` or ``closed`` to knock.txt."""

from __future__ import annotations

import os
import pathlib
import socket
from urllib.parse import urlsplit

url = urlsplit(os.environ["ANTHROPIC_BASE_URL"])
try:
    socket.create_connection((url.hostname, url.port), timeout=10).close()
    answer = "open"
except OSError:
    answer = "closed"
pathlib.Path("knock.txt").write_text(answer)
