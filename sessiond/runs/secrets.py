"""``[run] secrets``: resolved when a program starts, never stored (docs/design.md section 8).

The spec names each secret by reference: a variable of the daemon's environment
or a file. Its value is read here, at every start, put in the program's
environment under the secret's name, and added to the values the session masks
wherever it stores text (``Session.masked``): a program that prints its secret
gets it masked in its output artifacts and in any event.

A secret that cannot be read fails the start like a program that could not
start, with a reason naming the secret and where it was looked for (never a
value: there is none to show).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping

from sessiond.table.spec import SecretRef, SessionSpec

SECRET_FILE_LIMIT = 64 << 10  # a secret, not a data file


class SecretMissing(ValueError):
    """A ``[run] secrets`` entry whose value cannot be had; the message says why."""


def resolve(spec: SessionSpec, daemon_env: Mapping[str, str]) -> dict[str, str]:
    """Every secret's value by its name in the program's environment."""
    if spec.run is None:
        return {}
    return {name: _one(name, ref, daemon_env) for name, ref in spec.run.secrets.items()}


def known(spec: SessionSpec, daemon_env: Mapping[str, str]) -> frozenset[str]:
    """The values of ``spec``'s secrets that can be read now: masked from the moment
    the session is in the table, not only from its first run (a message may bring
    one). One that cannot be read fails that run, with the reason, as ever."""
    if spec.run is None:
        return frozenset()
    values = set()
    for name, ref in spec.run.secrets.items():
        with contextlib.suppress(SecretMissing):
            values.add(_one(name, ref, daemon_env))
    return frozenset(values)


def _one(name: str, ref: SecretRef, daemon_env: Mapping[str, str]) -> str:
    if ref.env is not None:
        value = daemon_env.get(ref.env)
        if value is None:
            raise SecretMissing(
                f"secret {name}: the daemon's environment has no variable {ref.env}; "
                "set it where the daemon is started (e.g. its systemd unit) and restart it"
            )
        where = f"the daemon's variable {ref.env}"
    else:
        assert ref.file is not None
        value = _read(name, ref.file)
        where = f"the file {ref.file}"
    if not value:
        raise SecretMissing(f"secret {name}: {where} is empty")
    if "\x00" in value:
        raise SecretMissing(
            f"secret {name}: {where} holds a NUL character, which no environment variable can carry"
        )
    return value


def _read(name: str, path: str) -> str:
    try:
        # not waiting: a FIFO would hold the open (and the daemon's loop with it)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise SecretMissing(
            f"secret {name}: cannot read the file {path}: {exc.strerror}; create it, "
            "readable by the daemon's user"
        ) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SecretMissing(
                f"secret {name}: {path} is not a regular file (a FIFO, a device or a "
                "folder); a secret file is a plain file that holds the secret"
            )
        raw = os.read(fd, SECRET_FILE_LIMIT + 1)
    except OSError as exc:
        raise SecretMissing(f"secret {name}: cannot read the file {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if len(raw) > SECRET_FILE_LIMIT:
        raise SecretMissing(
            f"secret {name}: the file {path} is over {SECRET_FILE_LIMIT} bytes; "
            "a secret file holds the secret only"
        )
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise SecretMissing(f"secret {name}: the file {path} is not UTF-8 text") from exc
    # Files are written with a final newline by editors and `echo`; it is not part of it.
    return text.removesuffix("\n").removesuffix("\r")
