"""The model gateway inside a sandbox without a network: a loopback relay.

A run whose sandbox has ``network = "none"`` has a network namespace of its own,
with nothing but its loopback: the daemon's gateway on the host's 127.0.0.1 is
out of its reach. The sandbox binds in the gateway's Unix socket, and this relay,
started in the sandbox before the program, listens on the sandbox's own
127.0.0.1 at the gateway's port and carries each connection to that socket. So
the run's ``ANTHROPIC_BASE_URL`` is the same address inside as out, and the only
thing it reaches is the gateway (which still wants the run's token).

    python -I gwrelay.py PORT SOCKET -- PROGRAM [ARGS...]

It listens first, then leaves a relay process behind (a grandchild: the
sandbox's init adopts it, the program never sees it as a child) and becomes the
program (exec): the program's pid, exit status and signals are its own. The
relay ends with the sandbox (its pid namespace ends when the program does).
Standard library only: it starts in a few milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _carry(conn: socket.socket, path: str) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        up.close()
        return
    back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
    back.start()
    _pump(conn, up)
    back.join()
    conn.close()
    up.close()


def serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        threading.Thread(target=_carry, args=(conn, path), daemon=True).start()


def main(argv: list[str]) -> None:
    if len(argv) < 5 or argv[3] != "--":
        sys.stderr.write("usage: gwrelay.py PORT SOCKET -- PROGRAM [ARGS...]\n")
        sys.exit(2)
    port, path, program = int(argv[1]), argv[2], argv[4:]
    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
    except OSError as exc:  # the program runs without the gateway, and says so
        sys.stderr.write(f"sessiond: the model gateway is not reachable in this sandbox: {exc}\n")
        os.execvp(program[0], program)
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            os.setsid()  # away from the program's terminal signals; the sandbox ends it
            serve(listener, path)
        os._exit(0)
    os.waitpid(child, 0)
    listener.close()
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv)
