"""The model: what the plugin knows and decides, as pure functions over frozen data.

Devices and inventories, the v1 config schema, resource sets (MIG strategies, time-slicing),
allocation answers, topology, packing, the Xid policy, the exception tree and the structured
log vocabulary. Nothing here touches NVML, gRPC, sockets or watched files, so every rule of
the plugin can be tested as a table.

May import: the standard library and PyYAML. Nothing else of the package.
"""
