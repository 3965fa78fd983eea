"""NVML + host files -> Inventory: the GPUs, their MIG devices (named from NVML attributes), NUMA
nodes and how GPUs are linked.

MIG profile names follow go-nvlib's rule (k8s-device-plugin >= v0.13): memory as a fraction of
the parent GPU rounded up to 1/8, times the parent's size in whole GiB, rounded half away from
zero; slices from the GPU- and compute-instance profiles; a suffix from the GPU-instance
profile (`+me`, `+me.all`, `+gfx`, `-me`). The profile text a simulator was given is never used.

Links: NVLinks are counted per GPU pair from each GPU's active links whose remote PCI bus id is
the peer (the smaller of the two directions). On NVSwitch systems a link's remote end is the
switch, so every pair of GPUs that both have switch links is NVLink-connected, counted as the
smaller number of switch links of the two. PCIe relation is NVML's common-ancestor level.

With `mig_profiles` (dynamic MIG), each MIG-capable GPU also carries the GPU-instance profiles
it offers with NVML's placements, named by the same rule as a MIG device of that profile.

A GPU that answers GPU_IS_LOST is left out of the inventory (logged `discovery.gpu.lost`), so
the rest of the node keeps being served; any other NVML failure raises NvmlError. The caller
owns NVML init/shutdown.
"""

from __future__ import annotations

import logging
from collections import Counter
from itertools import combinations
from pathlib import Path

from deviceplugin.model.devices import Gpu, Inventory, Link, MigDevice, MigProfile, PcieLevel
from deviceplugin.model.errors import GpuLostError
from deviceplugin.model.log import log_event
from deviceplugin.node.nvml import GiProfileInfo, GpuInfo, MigInfo, NumaReader, NvLink, Nvml

logger = logging.getLogger(__name__)

_MIB = 1 << 20
_GIB = 1 << 30
# NVML_GPU_INSTANCE_PROFILE_* enums whose profiles carry a suffix in their name.
_SUFFIXES = {
    0x7: "+me",  # 1_SLICE_REV1
    0x8: "+me",  # 2_SLICE_REV1
    0xA: "+gfx",
    0xB: "+gfx",
    0xC: "+gfx",
    0x11: "+gfx",
    0xD: "-me",  # *_NO_ME
    0xE: "-me",
    0xF: "+me.all",  # *_ALL_ME
    0x10: "+me.all",
}


def discover(nvml: Nvml, host_root: str = "/", mig_profiles: bool = False) -> Inventory:
    """Describe the node. `host_root` is where the host's /sys is mounted (for NUMA nodes);
    `mig_profiles` reads each MIG-capable GPU's profiles and placements too."""
    read_numa = sysfs_numa_reader(host_root)
    found: list[tuple[Gpu, list[NvLink]]] = []
    for index in range(nvml.gpu_count()):
        try:
            found.append(_gpu(nvml, index, read_numa, mig_profiles))
        except GpuLostError as err:
            log_event(logger, "discovery.gpu.lost", logging.WARNING, gpu=index, error=str(err))
    gpus = tuple(gpu for gpu, _ in found)
    return Inventory(
        gpus=gpus,
        links=_links(nvml, found),
        driver_version=nvml.driver_version(),
        cuda_driver_version=nvml.cuda_driver_version(),
    )


def _gpu(
    nvml: Nvml, index: int, read_numa: NumaReader, mig_profiles: bool
) -> tuple[Gpu, list[NvLink]]:
    info = nvml.gpu(index)
    migs = nvml.mig_devices(index) if info.mig_enabled else []
    profiles = nvml.gpu_instance_profiles(index) if mig_profiles and info.mig_capable else []
    gpu = Gpu(
        index=info.index,
        uuid=info.uuid,
        name=info.name,
        memory_mib=info.memory_total_bytes // _MIB,
        minor=info.minor,
        pci_bus_id=info.pci_bus_id,
        numa_node=nvml.numa_node(index, info.pci_bus_id, read_numa),
        compute_capability="{}.{}".format(*info.compute_capability),
        mig_capable=info.mig_capable,
        mig_enabled=info.mig_enabled,
        mig_devices=tuple(_mig_device(info, mig) for mig in migs),
        mig_profiles=tuple(_mig_profile(info, profile) for profile in profiles),
    )
    return gpu, nvml.nvlinks(index)


def _mig_profile(parent: GpuInfo, gi: GiProfileInfo) -> MigProfile:
    return MigProfile(
        name=mig_profile_name(
            gi.slices, gi.slices, gi.enum, gi.memory_mib, parent.memory_total_bytes
        ),
        profile_id=gi.id,
        memory_mib=gi.memory_mib,
        multiprocessors=gi.multiprocessors,
        copy_engines=gi.copy_engines,
        decoders=gi.decoders,
        encoders=gi.encoders,
        jpegs=gi.jpegs,
        ofas=gi.ofas,
        placements=gi.placements,
    )


def _mig_device(parent: GpuInfo, mig: MigInfo) -> MigDevice:
    return MigDevice(
        uuid=mig.uuid,
        index=mig.index,
        gpu_instance_id=mig.gpu_instance_id,
        compute_instance_id=mig.compute_instance_id,
        profile=mig_profile_name(
            mig.gpu_slices,
            mig.compute_slices,
            mig.gpu_instance_profile,
            mig.memory_mib,
            parent.memory_total_bytes,
        ),
        memory_mib=mig.memory_mib,
        gpu_slices=mig.gpu_slices,
        compute_slices=mig.compute_slices,
    )


def mig_profile_name(
    gpu_slices: int,
    compute_slices: int,
    gpu_instance_profile: int,
    memory_mib: int,
    parent_total_bytes: int,
) -> str:
    """The MIG profile name, e.g. `1g.10gb`, `1c.2g.20gb`, `1g.10gb+me` (go-nvlib's rule)."""
    # In exact integers (fractions would import decimal): the memory share rounded up to
    # eighths, times the parent's memory in GiB rounded up, rounded to the nearest GB.
    eighths = -(-8 * memory_mib * _MIB // parent_total_bytes)
    parent_gib = -(-parent_total_bytes // _GIB)
    gb = (eighths * parent_gib + 4) // 8
    name = f"{gpu_slices}g.{gb}gb"
    if compute_slices != gpu_slices:
        name = f"{compute_slices}c.{name}"
    return name + _SUFFIXES.get(gpu_instance_profile, "")


def sysfs_numa_reader(host_root: str) -> NumaReader:
    """Read a GPU's NUMA node from `<host_root>/sys/bus/pci/devices/<bus id>/numa_node`;
    unreadable or negative (no NUMA affinity) gives None."""
    devices = Path(host_root) / "sys" / "bus" / "pci" / "devices"

    def read(pci_bus_id: str) -> int | None:
        try:
            node = int((devices / sysfs_bus_id(pci_bus_id) / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    return read


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` as sysfs names it: `0000:3b:00.0`."""
    domain, rest = pci_bus_id.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _links(nvml: Nvml, found: list[tuple[Gpu, list[NvLink]]]) -> dict[tuple[int, int], Link]:
    by_bus = {sysfs_bus_id(gpu.pci_bus_id): gpu.index for gpu, _ in found}
    direct: Counter[tuple[int, int]] = Counter()
    switched: dict[int, int] = {}
    for gpu, nvlinks in found:
        switched[gpu.index] = sum(1 for link in nvlinks if link.to_switch)
        for link in nvlinks:
            peer = by_bus.get(sysfs_bus_id(link.remote_pci_bus_id))
            if peer is not None and not link.to_switch:
                direct[(gpu.index, peer)] += 1
    links: dict[tuple[int, int], Link] = {}
    indices = sorted(gpu.index for gpu, _ in found)
    for a, b in combinations(indices, 2):
        count = min(direct[(a, b)], direct[(b, a)]) + min(switched[a], switched[b])
        links[(a, b)] = Link(nvlinks=count, pcie=_pcie_level(nvml, a, b))
    return links


def _pcie_level(nvml: Nvml, a: int, b: int) -> PcieLevel:
    try:
        level = nvml.common_ancestor(a, b)
    except GpuLostError as err:
        log_event(logger, "discovery.gpu.lost", logging.WARNING, gpus=(a, b), error=str(err))
        return PcieLevel.SYSTEM
    if level is None:
        return PcieLevel.SYSTEM
    try:
        return PcieLevel(level)
    except ValueError:
        return PcieLevel.SYSTEM
