"""Inventories for the DRA tests: presets, and a 64-GPU node of seven 1g.10gb each, all
discovered through the simulator as `dra serve` would discover them."""

from __future__ import annotations

import contextlib
from pathlib import Path

from deviceplugin.model.devices import Inventory
from deviceplugin.model.errors import DevicePluginError
from deviceplugin.node.discovery import discover
from deviceplugin.sim.simulator import NodeSimulator
from tests.simnode import gpu, write_node

A100_GI_IDS = (7, 8, 9, 11, 12, 13, 14)


def inventory(simulate: str) -> Inventory:
    nvml = NodeSimulator(simulate).open_nvml(None)
    nvml.init()
    try:
        return discover(nvml)
    finally:
        with contextlib.suppress(DevicePluginError):
            nvml.shutdown()


def big_node(path: Path, gpus: int = 64) -> Path:
    """`gpus` A100-80GB, each cut into seven 1g.10gb MIG devices, eight per NUMA node."""
    entries = []
    for i in range(gpus):
        devices = [
            {
                "profile": "1g.10gb",
                "uuid": f"MIG-{i:08x}-{n:04x}-4000-8000-000000000000",
                "gpuInstanceId": gi,
            }
            for n, gi in enumerate(A100_GI_IDS)
        ]
        entries.append(
            gpu(
                i,
                pciBusId=f"0000{i // 32:04X}:{0x10 + i % 32:02X}:00.0",
                index=i,
                numaNode=i // 8,
                migCapable=True,
                migEnabled=True,
                migDevices=devices,
            )
        )
    return write_node(path, entries)
