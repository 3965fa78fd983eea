"""The node's devices as DRA sees them: `resource.k8s.io/v1` devices and ResourceSlices.

A DRA driver describes the hardware as it is, so the devices come from the inventory alone,
never from the device plugin's MIG strategy, renames or time-slicing: a GPU with MIG disabled is
one `gpu` device, a GPU with MIG enabled is its MIG devices (and none while it has no MIG
device), each physical device once. Health comes as UUID -> reason; a MIG device is unhealthy
when it or its parent GPU is.

Attributes are chosen so that two families of DeviceClasses select devices unchanged:

- NVIDIA's DRA driver's, unqualified (so in the driver's domain, `gpu.nvidia.com` by default):
  `type` (`gpu` / `mig`), `uuid`, `productName`, `architecture`, `cudaComputeCapability`,
  `driverVersion`, `cudaDriverVersion` (versions, semver-normalised as NVIDIA does), `index`,
  `minor` (GPU), `parentUUID`, `profile`, `parentIndex` (MIG), `pcieBusID`, capacity `memory`;
- the seed's, in `nvidia.com`: `migProfile` (empty for a whole GPU), `parentUUID` (the GPU the
  device lives on: itself for a whole GPU) and `healthy`. Every device carries all three, so
  a selector such as `device.attributes['nvidia.com'].migProfile == '1g.10gb'` evaluates on
  every device instead of failing on a whole GPU (a CEL error aborts the allocation). With
  memory shares on, every device also carries `memoryShares` (true for a whole GPU, which is
  then shareable: `model/memoryshares.py`).

Topology, for a claim's `matchAttribute`: the standard `resource.kubernetes.io/pciBusID` and
`resource.kubernetes.io/numaNode` (when known), and in `nvidia.com`: `numaNode`, `pcieRoot` and
`nvlinkIsland`, the last two the lowest GPU index of their group: GPUs under one PCIe host bridge
(NVML's common ancestor at HOSTBRIDGE or closer), GPUs joined by NVLink (directly or through
NVSwitch). A MIG device carries its GPU's values.

An unhealthy device also gets a taint `<driver>/unhealthy=<reason>` with the effect asked for
(`NoSchedule` by default, `NoExecute`, or none at all), in the v1 `taints` field the API server
keeps where the DRADeviceTaints gate is on (GA in 1.37) and drops where it is off. Slices are cut
at the API's limits: 128 devices, or 64 when a slice holds a tainted device or one that consumes
counters.

With dynamic MIG, a partitionable GPU is published whole and as every profile x placement, with
counter sets in slices of their own (`model/migpartitions.py` names them and their counters).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from deviceplugin.model.devices import Gpu, Inventory, MigDevice, PcieLevel
from deviceplugin.model.memoryshares import MEMORY, request_policy
from deviceplugin.model.migpartitions import (
    MAX_COUNTER_SETS,
    capacities,
    largest,
    partition_consumes,
    partition_name,
    partitionable,
    partitions,
    whole_consumes,
)

if TYPE_CHECKING:
    from deviceplugin.model.owners import Holdings

DRIVER = "gpu.nvidia.com"
SEED_DOMAIN = "nvidia.com"
STANDARD_DOMAIN = "resource.kubernetes.io"
API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_WITH_TAINTS = 64  # from 1.35, for a slice where any device has taints or counters
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # per device

TAKEN_TAINT = "mig-placement-taken"  # a dynamic MIG device a foreign MIG instance overlaps
TaintEffect = Literal["NoSchedule", "NoExecute"]
TAINT_EFFECTS: tuple[TaintEffect, ...] = ("NoSchedule", "NoExecute")
DEFAULT_TAINT: TaintEffect = "NoSchedule"

JsonObject = dict[str, Any]

# Compute capability (major, or major.minor where that differs) -> NVML's architecture name as
# NVIDIA's driver spells it; 10 and later are Blackwell.
_ARCHITECTURES = {
    "3": "Kepler",
    "5": "Maxwell",
    "6": "Pascal",
    "7": "Volta",
    "7.5": "Turing",
    "8": "Ampere",
    "8.9": "Ada Lovelace",
    "9": "Hopper",
}
_LABEL_VALUE_INVALID = r"[^A-Za-z0-9._-]+"
_BINARY_SUFFIXES = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def build_devices(
    inventory: Inventory,
    unhealthy: Mapping[str, str] | None = None,
    driver: str = DRIVER,
    taint: TaintEffect | None = DEFAULT_TAINT,
    memory_shares: bool = False,
    dynamic_mig: bool = False,
    blocked: Mapping[str, str] | None = None,
    withheld: Holdings | None = None,
    counters: bool = True,
) -> list[JsonObject]:
    """One v1 Device per physical device of the node, in GPU, then MIG index order; a device
    whose UUID or parent GPU's UUID is in `unhealthy` (UUID -> reason) is published unhealthy,
    tainted with `taint` unless that is None. With `memory_shares`, whole GPUs are published
    shareable by memory (`model.memoryshares`). With `dynamic_mig`, a partitionable GPU is
    published whole and as its partitions instead (never shareable: `model.migpartitions`);
    those named in `blocked` (name -> why: a MIG instance someone else made overlaps them) get
    the taint `<driver>/mig-placement-taken` (NoSchedule, whatever `taint` says: it is not
    about health), which the scheduler respects. A device `withheld` holds (a device plugin's
    pod has it: `model/owners.py`) is left out; a partitionable GPU with anything held is left
    out whole, with its partitions. Without `counters` (the API server would drop them), a
    partitionable GPU is published whole only, consuming nothing: partitions without counters
    would let the scheduler hand out overlapping ones."""
    groups = _Topology(inventory)
    sick = unhealthy or {}
    devices: list[JsonObject] = []
    for gpu, mig in physical_devices(inventory, dynamic_mig):
        if withheld and withheld.blocking(gpu.uuid, None if mig is None else mig.uuid):
            continue
        reason = unhealthy_reason(gpu, mig, sick)
        if dynamic_mig and partitionable(gpu):
            built = _partitioned(gpu, inventory, groups, driver, reason, taint, counters)
            for device in built:
                _block(device, driver, (blocked or {}).get(device["name"]))
            devices.extend(
                _shareable(device, None) if memory_shares else device for device in built
            )
            continue
        device = _device(gpu, mig, inventory, groups, driver, reason, taint)
        devices.append(
            _shareable(device, gpu if mig is None else None) if memory_shares else device
        )
    return devices


def _shareable(device: JsonObject, whole: Gpu | None) -> JsonObject:
    """Mark `device` for the shared classes (every device, so their selectors evaluate on MIG
    devices too) and, when it is the `whole` GPU, let the scheduler share its memory."""
    device["attributes"][f"{SEED_DOMAIN}/memoryShares"] = {"bool": whole is not None}
    if whole is not None:
        policy = request_policy(whole.memory_mib << 20, quantity)
        device["capacity"][MEMORY]["requestPolicy"] = policy
        device["allowMultipleAllocations"] = True
    return device


def physical_devices(
    inventory: Inventory, dynamic_mig: bool = False
) -> Iterator[tuple[Gpu, MigDevice | None]]:
    """What the node has, as DRA publishes it: each GPU with MIG disabled (mig None), and
    each MIG device of a GPU with MIG enabled; with `dynamic_mig`, a partitionable GPU whole
    (its partitions are `migpartitions.partitions`)."""
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        if not gpu.mig_enabled or (dynamic_mig and partitionable(gpu)):
            yield gpu, None
            continue
        yield from ((gpu, mig) for mig in sorted(gpu.mig_devices, key=lambda m: m.index))


def unhealthy_reason(gpu: Gpu, mig: MigDevice | None, unhealthy: Mapping[str, str]) -> str | None:
    """Why the device is unhealthy (its own reason first, else its GPU's); None if healthy."""
    own = unhealthy.get(mig.uuid) if mig is not None else None
    return own if own is not None else unhealthy.get(gpu.uuid)


def build_slices(
    node: str,
    devices: Sequence[JsonObject],
    generation: int,
    driver: str = DRIVER,
    counter_sets: Sequence[JsonObject] = (),
) -> list[JsonObject]:
    """The pool `node` as ResourceSlices named `<node>-<driver>-<n>`: first the `counter_sets`
    (dynamic MIG), in slices of their own of at most MAX_COUNTER_SETS (the API allows a slice
    devices or counters, not both), then the devices; at least one device slice, so an empty
    node still says it has nothing."""
    sets = [
        list(counter_sets[n : n + MAX_COUNTER_SETS])
        for n in range(0, len(counter_sets), MAX_COUNTER_SETS)
    ]
    chunks = split(devices)
    contents: list[tuple[str, list[JsonObject]]] = [("sharedCounters", s) for s in sets]
    contents += [("devices", chunk) for chunk in chunks]
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node, driver, n)},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {
                    "name": node,
                    "generation": generation,
                    "resourceSliceCount": len(contents),
                },
                field: list(items),
            },
        }
        for n, (field, items) in enumerate(contents)
    ]


def slice_name(node: str, driver: str, n: int) -> str:
    return f"{node}-{driver}-{n}"


def split(devices: Sequence[JsonObject]) -> list[list[JsonObject]]:
    """Consecutive runs of at most MAX_DEVICES, or MAX_DEVICES_WITH_TAINTS for a run holding a
    tainted device or one that consumes counters; always at least one (possibly empty) run."""
    chunks: list[list[JsonObject]] = [[]]
    tainted = False
    for device in devices:
        has_taints = bool(device.get("taints") or device.get("consumesCounters"))
        limit = MAX_DEVICES_WITH_TAINTS if tainted or has_taints else MAX_DEVICES
        if len(chunks[-1]) >= limit:
            chunks.append([])
            tainted = False
        chunks[-1].append(device)
        tainted = tainted or has_taints
    return chunks


def quantity(count: int) -> str:
    """A byte count in Kubernetes' canonical binary form: 85899345920 -> `80Gi`."""
    for suffix, shift in _BINARY_SUFFIXES:
        if count and count % (1 << shift) == 0:
            return f"{count >> shift}{suffix}"
    return str(count)


def semver(text: str) -> str | None:
    """NVIDIA's loose parse: up to three numeric parts, zero-padded (`550.90.07` -> `550.90.7`,
    `8.0` -> `8.0.0`); None for text that has no such reading."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


def architecture(compute_capability: str) -> str:
    """NVML's architecture name, from the compute capability the inventory holds."""
    major, _, minor = compute_capability.partition(".")
    if not major.isdigit():
        return "Unknown"
    if int(major) >= 10:
        return "Blackwell"
    by_version = _ARCHITECTURES.get(f"{major}.{minor}")
    return by_version or _ARCHITECTURES.get(major, "Unknown")


def label_value(text: str) -> str:
    """`text` made a valid label value (a taint's value): at most 63 of [A-Za-z0-9._-], starting
    and ending alphanumeric."""
    cleaned = re.sub(_LABEL_VALUE_INVALID, "-", text)[:63]
    return cleaned.strip("-._")


class _Topology:
    """Group numbers per GPU index: PCIe host bridge and NVLink island, each the lowest GPU index
    of its connected group."""

    def __init__(self, inventory: Inventory) -> None:
        indices = [gpu.index for gpu in inventory.gpus]
        pairs = [(a, b, inventory.link(a, b)) for a in indices for b in indices if a < b]
        bridged = ((a, b) for a, b, link in pairs if link.pcie <= PcieLevel.HOSTBRIDGE)
        self.pcie = _components(indices, bridged)
        self.nvlink = _components(indices, ((a, b) for a, b, link in pairs if link.nvlinks > 0))


def _components(indices: Iterable[int], edges: Iterable[tuple[int, int]]) -> dict[int, int]:
    root = {index: index for index in indices}

    def find(index: int) -> int:
        while root[index] != index:
            root[index] = root[root[index]]
            index = root[index]
        return index

    for a, b in edges:
        low, high = sorted((find(a), find(b)))
        root[high] = low
    return {index: find(index) for index in root}


def _device(
    gpu: Gpu,
    mig: MigDevice | None,
    inventory: Inventory,
    groups: _Topology,
    driver: str,
    reason: str | None,
    taint: TaintEffect | None,
) -> JsonObject:
    attributes: dict[str, JsonObject] = {"type": {"string": "gpu" if mig is None else "mig"}}
    attributes["uuid"] = {"string": gpu.uuid if mig is None else mig.uuid}
    if mig is not None:
        attributes["parentUUID"] = {"string": gpu.uuid}
        attributes["profile"] = {"string": mig.profile}
    if mig is None:
        attributes["index"] = {"int": gpu.index}
        attributes["minor"] = {"int": gpu.minor}
    else:
        attributes["index"] = {"int": mig.index}
        attributes["parentIndex"] = {"int": gpu.index}
    _common(attributes, gpu, inventory, groups, mig.profile if mig else "", reason)
    memory_mib = gpu.memory_mib if mig is None else mig.memory_mib
    published: JsonObject = {
        "name": device_name(gpu, mig),
        "attributes": attributes,
        "capacity": {"memory": {"value": quantity(memory_mib << 20)}},
    }
    _taint(published, driver, reason, taint)
    return published


def _partitioned(
    gpu: Gpu,
    inventory: Inventory,
    groups: _Topology,
    driver: str,
    reason: str | None,
    taint: TaintEffect | None,
    counters: bool = True,
) -> list[JsonObject]:
    """A partitionable GPU in dynamic MIG mode: whole (consuming its whole counter set, with
    its largest capacities), then each of its partitions (`model/migpartitions.py`); whole
    alone, consuming nothing, without `counters`."""
    whole = _device(gpu, None, inventory, groups, driver, reason, taint)
    biggest = {k: {"value": quantity(v)} for k, v in largest(gpu).items() if k != "memory"}
    whole["capacity"].update(biggest)
    if not counters:
        return [whole]
    whole["consumesCounters"] = whole_consumes(gpu, quantity)
    devices = [whole]
    for profile, start, size in partitions(gpu):
        attributes: dict[str, JsonObject] = {
            "type": {"string": "mig"},
            "parentUUID": {"string": gpu.uuid},
            "profile": {"string": profile.name},
            "parentIndex": {"int": gpu.index},
            "placementStart": {"int": start},
            "placementSize": {"int": size},
        }
        _common(attributes, gpu, inventory, groups, profile.name, reason)
        device: JsonObject = {
            "name": partition_name(gpu, profile, start),
            "attributes": attributes,
            "capacity": {k: {"value": quantity(v)} for k, v in capacities(profile).items()},
            "consumesCounters": partition_consumes(gpu, profile, start, size, quantity),
        }
        _taint(device, driver, reason, taint)
        devices.append(device)
    return devices


def _common(
    attributes: dict[str, JsonObject],
    gpu: Gpu,
    inventory: Inventory,
    groups: _Topology,
    profile: str,
    reason: str | None,
) -> None:
    """The attributes every device of `gpu` carries: the GPU's product, versions and topology,
    and the seed's (`migProfile` empty for the whole GPU)."""
    attributes["productName"] = {"string": gpu.name}
    attributes["architecture"] = {"string": architecture(gpu.compute_capability)}
    versions = {
        "cudaComputeCapability": semver(gpu.compute_capability),
        "driverVersion": semver(inventory.driver_version),
        "cudaDriverVersion": _cuda_version(inventory.cuda_driver_version),
    }
    attributes.update({k: {"version": v} for k, v in versions.items() if v is not None})
    bus_id = _sysfs_bus_id(gpu.pci_bus_id)
    attributes["pcieBusID"] = {"string": bus_id}
    attributes[f"{STANDARD_DOMAIN}/pciBusID"] = {"string": bus_id}
    if gpu.numa_node is not None:
        attributes[f"{STANDARD_DOMAIN}/numaNode"] = {"int": gpu.numa_node}
    attributes[f"{SEED_DOMAIN}/migProfile"] = {"string": profile}
    attributes[f"{SEED_DOMAIN}/parentUUID"] = {"string": gpu.uuid}
    attributes[f"{SEED_DOMAIN}/healthy"] = {"bool": reason is None}
    if gpu.numa_node is not None:
        attributes[f"{SEED_DOMAIN}/numaNode"] = {"int": gpu.numa_node}
    attributes[f"{SEED_DOMAIN}/pcieRoot"] = {"int": groups.pcie[gpu.index]}
    attributes[f"{SEED_DOMAIN}/nvlinkIsland"] = {"int": groups.nvlink[gpu.index]}


def _block(device: JsonObject, driver: str, why: str | None) -> None:
    if why is not None:
        taint = {
            "key": f"{driver}/{TAKEN_TAINT}",
            "value": label_value(why),
            "effect": "NoSchedule",
        }
        device["taints"] = [*device.get("taints", []), taint]


def _taint(device: JsonObject, driver: str, reason: str | None, taint: TaintEffect | None) -> None:
    if reason is not None and taint is not None:
        device["taints"] = [
            {"key": f"{driver}/unhealthy", "value": label_value(reason), "effect": taint}
        ]


def device_name(gpu: Gpu, mig: MigDevice | None) -> str:
    """`gpu-<minor>` as NVIDIA's driver names a GPU; `gpu-<minor>-mig-<gi>-<ci>` for a MIG device
    (GPU and compute instance ids are unique on their GPU)."""
    if mig is None:
        return f"gpu-{gpu.minor}"
    return f"gpu-{gpu.minor}-mig-{mig.gpu_instance_id}-{mig.compute_instance_id}"


def _cuda_version(code: int) -> str | None:
    """NVML's CUDA driver version 12040 -> `12.4.0`."""
    if code <= 0:
        return None
    return f"{code // 1000}.{code % 1000 // 10}.0"


def _sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` as the standard attribute spells it: `0000:3b:00.0`."""
    domain, _, rest = pci_bus_id.lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return pci_bus_id.lower()
