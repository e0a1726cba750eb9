"""The Unix-socket server and the dispatch to the syscalls.

server.py   the sockets (the control socket, the program endpoint): listening, a stale
            socket, the connection lifecycle
peers.py    who may connect (the peer-credential check)
runpeer.py  whether a control-socket peer is a process of a run (then: only ping)
program.py  the program endpoint's rules: the run's token, [run] grants, as whom
frames.py   newline-delimited JSON frames, in and out
dispatch.py the method table: a request decoded, checked, a Kernel call, one answer
params.py   the request schema: one params model per method
follow.py   ``log`` and ``log --follow``, the one method that streams
"""
