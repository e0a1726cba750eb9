"""Starting and supervising session programs, settling finished runs, recovery
after a crash, and the daemon side of the SDK.

One run, in the order it happens: ``continuation`` (wake → gate → admit or
queue) → ``start`` (the command's tool call, the launch) → ``supervise`` (wait,
stop on request) → ``settle`` (record the end, decide what comes next), with
``recover`` for what a crash or an interruption cut off. ``runs.Runs`` wires
them; ``context`` holds what they share, ``workspace`` the file helpers,
``tokens`` and ``sdk_calls`` the SDK's side, ``runner`` the processes,
started and reaped by the ``spawner`` process (``spawn`` is the daemon's side of
it; ``leftovers`` finds what a dead daemon and a dead spawner left).
``commands`` runs a session's other commands (``[compact] exec``) the way its
program runs.
"""
