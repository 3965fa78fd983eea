"""What each daemon may weigh once it serves: its RSS, and the modules it has loaded by then.

The one place these are written: `tests/test_startup_imports.py` runs both daemons as
processes on a simulated node and fails past any of them, naming the module that is new; the
benchmark (`bench/scenarios.py`, `bench/drastart.py`) holds its RSS goals to the same figures.
Start-up times are not here: they vary too much with the machine to assert, so they stay
goals of `make bench` (docs/performance.md).

RSS counts the pages of shared libraries the process touched, and how many of those the
kernel maps at once depends on how the file sits in the page cache: the same `import grpc`
measured 33 to 37.5 MiB on one machine. The budgets leave that much room above what the
daemons weigh today (docs/performance.md, "What grew").

A module that is not the standard library's counts by its top-level package (`grpc`,
`yaml`); one of ours counts by its full name, so a module of this package that starts to load
where it did not before fails the test by name. Making it lazy (imported where it is used) or
adding it here, with the reason, are the two ways on.
"""

from __future__ import annotations

MIB = 1024 * 1024

# `deviceplugin serve --simulate a100-80gb-x8-mixed` with the seed ConfigMap, whole GPUs
# time-sliced 8 ways: after registration, and after 2,000 Allocates.
SERVE_RSS_MIB = 45.0
# `deviceplugin dra serve --simulate a100-80gb-x8-mixed`, once its slices are published.
DRA_SERVE_RSS_MIB = 60.0

# Standard-library modules neither daemon loads to start: OpenSSL (asyncio loads without it,
# `runtime/leanimports.py`), and what only a feature that is off needs.
HEAVY_STDLIB = frozenset({"ssl", "_ssl", "hashlib", "_hashlib", "secrets", "hmac"})
# `dra serve` speaks TLS once its Kubernetes client is imported, and hashes its checkpoint.
DRA_HEAVY_STDLIB = frozenset({"secrets"})

SERVE_PACKAGES = frozenset(
    {"deviceplugin", "google", "grpc", "grpc_tools", "typing_extensions", "yaml"}
)
DRA_SERVE_PACKAGES = SERVE_PACKAGES | frozenset(
    {
        "anyio",
        "h11",
        "httpcore2",
        "httpx2",
        "idna",
        "lightkube",
        "msgspec",
        "sniffio",
        "truststore",
    }
)

# Ours, by name: what both daemons load to start (the command line, the node engine, NVML and
# the simulated node), then what each loads beyond it.
_COMMON_MODULES = frozenset(
    {
        "deviceplugin",
        "deviceplugin.cli",
        "deviceplugin.model",
        "deviceplugin.model.allocation",
        "deviceplugin.model.config",
        "deviceplugin.model.config_keys",
        "deviceplugin.model.configselect",
        "deviceplugin.model.devices",
        "deviceplugin.model.errors",
        "deviceplugin.model.hostpaths",
        "deviceplugin.model.kubenames",
        "deviceplugin.model.log",
        "deviceplugin.model.memoryshares",
        "deviceplugin.model.migpartitions",
        "deviceplugin.model.mps",
        "deviceplugin.model.record",
        "deviceplugin.model.resources",
        "deviceplugin.model.slices",
        "deviceplugin.model.strict",
        "deviceplugin.model.xidpolicy",
        "deviceplugin.model.yamlimport",
        "deviceplugin.node",
        "deviceplugin.node.cdiwriter",
        "deviceplugin.node.configread",
        "deviceplugin.node.discovery",
        "deviceplugin.node.health",
        "deviceplugin.node.inotify",
        "deviceplugin.node.mpsdaemon",
        "deviceplugin.node.mpsshm",
        "deviceplugin.node.nvml",
        "deviceplugin.node.nvml_api",
        "deviceplugin.node.regularfile",
        "deviceplugin.node.simmarker",
        "deviceplugin.node.unixgrpc",
        "deviceplugin.node.xidcatalog",
        "deviceplugin.ops",
        "deviceplugin.ops.corestatus",
        "deviceplugin.ops.logs",
        "deviceplugin.ops.metrics",
        "deviceplugin.program",
        "deviceplugin.runtime",
        "deviceplugin.runtime.background",
        "deviceplugin.runtime.collector",
        "deviceplugin.runtime.configfile",
        "deviceplugin.runtime.engine",
        "deviceplugin.runtime.host",
        "deviceplugin.runtime.leanimports",
        "deviceplugin.runtime.offloop",
        "deviceplugin.runtime.options",
        "deviceplugin.runtime.run",
        "deviceplugin.runtime.scratch",
        "deviceplugin.runtime.watch",
        "deviceplugin.sim",
        "deviceplugin.sim.events",
        "deviceplugin.sim.fake_nvml",
        "deviceplugin.sim.hostroot",
        "deviceplugin.sim.node",
        "deviceplugin.sim.profiles",
        "deviceplugin.sim.simulator",
        "deviceplugin.sim.structs",
        "deviceplugin.sim.world",
        "deviceplugin.wire",
    }
)
SERVE_MODULES = _COMMON_MODULES | frozenset(
    {
        "deviceplugin.kubelet",
        "deviceplugin.kubelet.registrar",
        "deviceplugin.kubelet.registration",
        "deviceplugin.kubelet.responder",
        "deviceplugin.kubelet.server",
        "deviceplugin.model.gpuset",
        "deviceplugin.model.packing",
        "deviceplugin.model.topology",
        "deviceplugin.node.hostdevices",
        "deviceplugin.plugin",
        "deviceplugin.plugin.cdispec",
        "deviceplugin.plugin.draholds",  # small; its PodResources client loads only with the socket
        "deviceplugin.plugin.service",
        "deviceplugin.plugin.supervisor",
        "deviceplugin.wire.deviceplugin",
        "deviceplugin.wire.deviceplugin.v1beta1",
        "deviceplugin.wire.deviceplugin.v1beta1.api_pb2",
        "deviceplugin.wire.deviceplugin.v1beta1.api_pb2_grpc",
    }
)
DRA_SERVE_MODULES = _COMMON_MODULES | frozenset(
    {
        "deviceplugin.dra",
        "deviceplugin.dra.admission",
        "deviceplugin.dra.checkpoint",
        "deviceplugin.dra.coexistence",
        "deviceplugin.dra.devicehealth",
        "deviceplugin.dra.driver",
        "deviceplugin.dra.failpoints",
        "deviceplugin.dra.kubeapi",
        "deviceplugin.dra.kubeletcalls",
        "deviceplugin.dra.memorylimits",
        "deviceplugin.dra.migcut",
        "deviceplugin.dra.migrecord",
        "deviceplugin.dra.mpsclient",
        "deviceplugin.dra.mpsdevices",
        "deviceplugin.dra.mpstenants",
        "deviceplugin.dra.nodelock",
        "deviceplugin.dra.opaque",
        "deviceplugin.dra.opaquebounds",
        "deviceplugin.dra.opaquetypes",
        "deviceplugin.dra.plugin",
        "deviceplugin.dra.pluginholds",  # small; its PodResources client loads only with the socket
        "deviceplugin.dra.prepare",
        "deviceplugin.dra.publisher",
        "deviceplugin.dra.registration",
        "deviceplugin.dra.serverfeatures",
        "deviceplugin.dra.service",
        "deviceplugin.dra.shares",
        "deviceplugin.dra.slicewatch",
        "deviceplugin.model.cdi",
        "deviceplugin.model.assignments",
        "deviceplugin.model.gatedfields",
        "deviceplugin.model.jsonobject",
        "deviceplugin.model.owners",
        "deviceplugin.model.quantity",
        "deviceplugin.node.hostscan",
        "deviceplugin.node.nvml_mig",
        "deviceplugin.ops.drametrics",
        "deviceplugin.ops.drastatus",
        "deviceplugin.runtime.kubeclient",
        "deviceplugin.wire.dra",
        "deviceplugin.wire.dra.v1",
        "deviceplugin.wire.dra.v1.api_pb2",
        "deviceplugin.wire.dra.v1.api_pb2_grpc",
        "deviceplugin.wire.dra.v1beta1",
        "deviceplugin.wire.dra.v1beta1.api_pb2",
        "deviceplugin.wire.dra.v1beta1.api_pb2_grpc",
        "deviceplugin.wire.drahealth",
        "deviceplugin.wire.drahealth.v1",
        "deviceplugin.wire.drahealth.v1.api_pb2",
        "deviceplugin.wire.drahealth.v1.api_pb2_grpc",
        "deviceplugin.wire.drahealth.v1alpha1",
        "deviceplugin.wire.drahealth.v1alpha1.api_pb2",
        "deviceplugin.wire.drahealth.v1alpha1.api_pb2_grpc",
        "deviceplugin.wire.pluginregistration",
        "deviceplugin.wire.pluginregistration.v1",
        "deviceplugin.wire.pluginregistration.v1.api_pb2",
        "deviceplugin.wire.pluginregistration.v1.api_pb2_grpc",
    }
)
