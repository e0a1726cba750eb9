"""The Unix-socket server and the dispatch to the syscalls.

server.py   the socket: listening, a stale socket, the connection lifecycle
peers.py    who may connect (the peer-credential check)
frames.py   newline-delimited JSON frames, in and out
dispatch.py the method table: a request decoded, checked, a Kernel call, one answer
params.py   the request schema: one params model per method
follow.py   ``log`` and ``log --follow``, the one method that streams
"""
