"""What both daemons share: the node engine (NVML, discovery, health, the simulated host,
shutdown, one serialized path for state changes).

May import `model`, `node`, `ops` and `runtime`: never a daemon (`plugin`, `dra`), the root, or
`sim`, whose simulator the composition builds and hands down (`host.Simulator`).
"""
