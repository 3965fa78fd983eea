"""A simulated node rendered for the C `libnvidia-ml.so.1` (`sim/native/`): every NVML answer
precomputed, as JSON, so the library serves tables and parses no YAML.

The node file (SPEC section 3) stays the one truth: `sim-root` renders it here, with the same
profile tables (`profiles.py`) and topology rules (`fake_nvml.py`) the Python simulator uses,
and writes the result beside the library. The format, read by `native/node.c`:

    {"format": 1, "driverVersion": "550.90.07", "cudaDriverVersion": 12040,
     "nvmlVersion": "12.550.90.07",
     "gpus": [{"index": 0, "uuid": "GPU-...", "name": "...", "serial": "...", "brand": 14,
               "architecture": 7, "minor": 0, "memoryMiB": 81920,
               "pciBusId": "00000000:07:00.0", "pciDeviceId": 548540638, "numaNode": 0 (or -1),
               "computeCapability": [8, 0], "migCapable": true, "migEnabled": true,
               "supportedEvents": 31, "notSupported": ["nvmlDeviceGetRemappedRows"],
               "topology": [levels to the GPU of each index],
               "nvlinks": [{"remotePciBusId": "...", "toSwitch": false}],
               "giProfiles": [{"enum": 0, "id": 19, "name": "1g.10gb", "slices": 1,
                               "instances": 7, "sms": 14, "copyEngines": 1, "decoders": 0,
                               "jpegs": 0, "ofas": 0,
                               "memoryMiB": 9728, "placements": [[0, 1], [1, 1], ...]}],
               "migDevices": [{"uuid": "MIG-...", "name": "... MIG 1g.10gb",
                               "gpuInstanceId": 7, "computeInstanceId": 0, "giEnum": 0,
                               "giProfileId": 19, "giSlices": 1, "ciSlices": 1, "sms": 14,
                               "copyEngines": 1, "decoders": 0, "jpegs": 0, "ofas": 0,
                               "memoryMiB": 9728, "placement": [0, 1]}]}]}
"""

from __future__ import annotations

import json
from typing import Any

from deviceplugin.sim.fake_nvml import common_ancestor, gpu_instance_profiles, switch_bus_id
from deviceplugin.sim.node import Node, SimGpu
from deviceplugin.sim.profiles import (
    KNOWN_MODELS,
    GiProfile,
    gpu_slices,
    instance_count,
    placements,
)

FORMAT = 1
_NVIDIA_VENDOR = 0x10DE
_BRAND_NVIDIA = 14
_ARCH_UNKNOWN = 0xFFFFFFFF
# NVML_DEVICE_ARCH_* by CUDA compute capability major (minor where it splits a major).
_ARCH_BY_CAPABILITY = {
    (5, None): 3,  # Maxwell
    (6, None): 4,  # Pascal
    (7, 0): 5,  # Volta
    (7, 2): 5,
    (7, 5): 6,  # Turing
    (8, 9): 8,  # Ada
    (8, None): 7,  # Ampere
    (9, None): 9,  # Hopper
    (10, None): 10,  # Blackwell
    (12, None): 10,
}
# PCI device ids of the models the presets and profile tables name (nvidia-smi -q).
_PCI_DEVICE_IDS = {
    "NVIDIA A100-SXM4-80GB": 0x20B2,
    "NVIDIA A100-SXM4-40GB": 0x20B0,
    "NVIDIA A30": 0x20B7,
    "NVIDIA A10": 0x2236,
    "NVIDIA H100 80GB HBM3": 0x2330,
    "NVIDIA H100 NVL": 0x2321,
    "NVIDIA H200": 0x2335,
    "NVIDIA B200": 0x2901,
    "Tesla V100-SXM2-16GB": 0x1DB1,
}


def render(node: Node) -> str:
    """The JSON the simulated library reads for `node`."""
    document = {
        "format": FORMAT,
        "driverVersion": node.driver_version,
        "cudaDriverVersion": node.cuda_driver_version,
        "nvmlVersion": f"{node.cuda_driver_version // 1000}.{node.driver_version}",
        "gpus": [_gpu(gpu, node) for gpu in node.gpus],
    }
    return json.dumps(document, indent=1) + "\n"


def _gpu(gpu: SimGpu, node: Node) -> dict[str, Any]:
    profiles = gpu_instance_profiles(gpu)
    total = gpu_slices(profiles)
    # Profile names, for the MIG devices the library creates: the model's, else the node's.
    names = {mig.shape.gpu_instance.enum: mig.profile.split("c.", 1)[-1] for mig in gpu.mig_devices}
    names.update({gi.enum: name for name, gi in KNOWN_MODELS.get(gpu.name, {}).items()})
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "serial": _serial(gpu),
        "brand": _BRAND_NVIDIA,
        "architecture": _architecture(gpu.compute_capability),
        "minor": gpu.minor,
        "memoryMiB": gpu.memory_mib,
        "pciBusId": gpu.pci_bus_id,
        "pciDeviceId": (_PCI_DEVICE_IDS.get(gpu.name, 0) << 16) | _NVIDIA_VENDOR,
        "numaNode": -1 if gpu.numa_node is None else gpu.numa_node,
        "computeCapability": list(gpu.compute_capability),
        "migCapable": gpu.mig_capable,
        "migEnabled": gpu.mig_enabled,
        "supportedEvents": gpu.supported_events,
        "notSupported": sorted(gpu.not_supported),
        "topology": [common_ancestor(gpu, other) for other in node.gpus],
        "nvlinks": _nvlinks(gpu, node),
        "giProfiles": (
            [_profile(gi, total, names.get(gi.enum, "")) for gi in profiles.values()]
            if gpu.mig_capable
            else []
        ),
        "migDevices": _mig_devices(gpu),
    }


def _profile(gi: GiProfile, total: int, name: str) -> dict[str, Any]:
    places = placements(gi, total)
    return {
        "enum": gi.enum,
        "id": gi.id,
        "name": name,
        "slices": gi.slices,
        "instances": instance_count(gi, total),
        "sms": gi.multiprocessors,
        "copyEngines": gi.slices,
        "decoders": gi.decoders,
        "jpegs": gi.jpegs,
        "ofas": gi.ofas,
        "memoryMiB": gi.memory_mib,
        "placements": [list(place) for place in places],
    }


def _mig_devices(gpu: SimGpu) -> list[dict[str, Any]]:
    """The MIG devices, each at its GPU instance's placement (node.py placed them)."""
    devices = []
    for mig in gpu.mig_devices:
        gi = mig.shape.gpu_instance
        devices.append(
            {
                "uuid": mig.uuid,
                "name": f"{gpu.name} MIG {mig.profile}",
                "gpuInstanceId": mig.gpu_instance_id,
                "computeInstanceId": mig.compute_instance_id,
                "giEnum": gi.enum,
                "giProfileId": gi.id,
                "giSlices": gi.slices,
                "ciSlices": mig.shape.compute_slices,
                "sms": mig.shape.multiprocessors,
                "copyEngines": gi.slices,
                "decoders": gi.decoders,
                "jpegs": gi.jpegs,
                "ofas": gi.ofas,
                "memoryMiB": gi.memory_mib,
                "placement": list(mig.placement),
            }
        )
    return devices


def _nvlinks(gpu: SimGpu, node: Node) -> list[dict[str, Any]]:
    links = [
        {"remotePciBusId": node.gpus[peer].pci_bus_id, "toSwitch": False}
        for peer in gpu.nvlink_peers
    ]
    for link in range(len(links), len(links) + gpu.nvswitch_links):
        links.append({"remotePciBusId": switch_bus_id(link), "toSwitch": True})
    return links


def _architecture(capability: tuple[int, int]) -> int:
    major, minor = capability
    found = _ARCH_BY_CAPABILITY.get((major, minor), _ARCH_BY_CAPABILITY.get((major, None)))
    return _ARCH_UNKNOWN if found is None else found


def _serial(gpu: SimGpu) -> str:
    """A 13-digit board serial, stable for a UUID."""
    digits = "".join(str(int(c, 16) % 10) for c in gpu.uuid[4:].replace("-", ""))
    return f"1{digits[:12]:0<12}"
