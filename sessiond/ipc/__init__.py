"""The Unix-socket server: framing, request models, the peer check, and dispatch
to the syscalls."""
