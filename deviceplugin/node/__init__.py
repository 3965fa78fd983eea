"""The node: everything the plugin reads from the host it runs on.

NVML (the only `pynvml` importer) and discovery of the inventory, host files (device nodes,
the driver's mig-minors table), the health monitor's NVML event loop, and gRPC servers on unix
sockets. One node engine feeds every front-end.

May import: `deviceplugin.model`. Never a front-end or the composition root.
"""
