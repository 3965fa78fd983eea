"""The device model: what a node has (Inventory of GPUs and MIG devices, their links) and what
the plugin advertises (Device, one per ID the kubelet sees), as frozen values.

Everything here is pure data. Discovery builds an Inventory from NVML; resources.py turns an
Inventory and a config into Devices grouped by resource name; health marks Devices Unhealthy by
physical UUID. Because the values are frozen and comparable, "what changed" is plain equality.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, replace
from enum import IntEnum, StrEnum

from deviceplugin.model.record import record


class Health(StrEnum):
    """The two health strings the kubelet understands (anything else counts as Unhealthy)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


class PcieLevel(IntEnum):
    """NVML's common-ancestor level between two GPUs; lower is closer."""

    INTERNAL = 0  # same board
    SINGLE = 10  # one PCIe switch
    MULTIPLE = 20  # several PCIe switches, no host bridge
    HOSTBRIDGE = 30  # the same host bridge
    NODE = 40  # host bridges on the same NUMA node
    SYSTEM = 50  # across NUMA nodes (SMP interconnect)


@record(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance with its compute instance) on a parent GPU."""

    uuid: str
    index: int  # NVML's MIG device index on the parent; index IDs read "<gpu>:<index>"
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # derived from NVML attributes, e.g. "1g.10gb", "1g.10gb+me", "1c.2g.20gb"
    memory_mib: int
    gpu_slices: int
    compute_slices: int


@record(frozen=True)
class MigProfile:
    """One GPU-instance profile a MIG-capable GPU offers, with where NVML lets an instance of
    it start: what dynamic MIG publishes a partition device for (one per placement)."""

    name: str  # as a MIG device of it is named: "1g.10gb", "1g.10gb+me"
    profile_id: int  # the driver's GPU-instance profile id (NVIDIA's device names carry it)
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices, NVML's order


@record(frozen=True)
class Gpu:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int  # /dev/nvidia<minor>
    pci_bus_id: str
    numa_node: int | None
    compute_capability: str = ""
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    mig_profiles: tuple[MigProfile, ...] = ()  # read only for dynamic MIG; empty otherwise


@record(frozen=True)
class Link:
    """How two GPUs are connected: active NVLinks between them and their PCIe relation."""

    nvlinks: int = 0
    pcie: PcieLevel = PcieLevel.SYSTEM


@record(frozen=True)
class Inventory:
    """Everything discovery learned about a node; rebuilt on rediscovery, compared by value."""

    gpus: tuple[Gpu, ...]
    links: Mapping[tuple[int, int], Link] = field(default_factory=dict)  # key: (low, high) index
    driver_version: str = ""
    cuda_driver_version: int = 0

    def link(self, a: int, b: int) -> Link:
        """The link between GPUs `a` and `b` (indices, either order); unknown pairs are SYSTEM."""
        return self.links.get((min(a, b), max(a, b)), Link())

    def gpu(self, uuid: str) -> Gpu | None:
        """The GPU with this UUID, or None."""
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        return None


@record(frozen=True)
class Device:
    """One device ID advertised to the kubelet, with the physical device behind it.

    `id` is what the kubelet sees: a GPU UUID, a MIG UUID, or `<uuid>::<n>` for a time-sliced
    replica. `physical_uuid` is the GPU or MIG UUID that a container must be given.
    """

    id: str
    physical_uuid: str
    gpu_uuid: str
    gpu_index: int
    gpu_minor: int
    numa_node: int | None
    mig: MigDevice | None = None
    replica: int | None = None  # None when the device is not time-sliced
    health: Health = Health.HEALTHY
    reason: str = ""  # why the device is Unhealthy; empty while Healthy

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY

    @property
    def index_id(self) -> str:
        """The ID in the `index` strategy: `<gpu>` for a GPU, `<gpu>:<mig>` for a MIG device."""
        if self.mig is None:
            return str(self.gpu_index)
        return f"{self.gpu_index}:{self.mig.index}"


def replica_id(physical_uuid: str, replica: int) -> str:
    """The kubelet-facing ID of replica `replica` of a shared device: `<uuid>::<n>`."""
    return f"{physical_uuid}::{replica}"


def strip_replica(device_id: str) -> str:
    """The physical UUID behind a device ID (the part before `::`)."""
    return device_id.split("::", 1)[0]


def keep_unhealthy_gpus(
    previous: Inventory | None, found: Inventory, unhealthy: Mapping[str, str]
) -> Inventory:
    """`found`, plus every GPU of `previous` that is marked Unhealthy and was not found again
    (a GPU that fell off the bus stops answering discovery) — with its links."""
    if previous is None:
        return found
    present = {gpu.uuid for gpu in found.gpus}
    kept = [g for g in previous.gpus if g.uuid not in present and g.uuid in unhealthy]
    if not kept:
        return found
    indices = {gpu.index for gpu in kept}
    links: dict[tuple[int, int], Link] = {
        pair: link for pair, link in previous.links.items() if indices & set(pair)
    }
    links.update(found.links)
    gpus = tuple(sorted((*found.gpus, *kept), key=lambda gpu: gpu.index))
    return replace(found, gpus=gpus, links=links)
