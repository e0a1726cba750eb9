"""What each syscall does to the process table (DESIGN.md section 3). The RPC
layer (sessiond.ipc) decodes requests and calls these."""
