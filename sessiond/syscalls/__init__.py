"""What each syscall does to the process table (docs/design.md section 3). The RPC
layer (sessiond.ipc) decodes requests and calls these, through ``kernel.Kernel``.

By family: ``inspection`` (ping ps show log replay gate), ``control`` (create
activate suspend resume interrupt cancel), ``lineage`` (fork merge send migrate
compact export import), ``approvals`` (approve deny resolve)."""
