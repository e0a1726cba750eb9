"""Starting and supervising session programs, settling finished runs, recovery
after a crash, and the daemon side of the SDK."""
