"""The nodes and configs the benchmark runs `serve` on, written as files the way a user would.

`default`: the preset `a100-80gb-x8-mixed` (4 GPUs x 7 MIG 1g.10gb, 4 whole GPUs) with the
seed ConfigMap of the demo (mixed strategy, whole GPUs time-sliced). `large`: 16 GPUs x 7 MIG
1g.10gb, the MIG resource time-sliced 16 ways (1,792 IDs), the largest node we plan for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from deviceplugin.demos.plugin import SEED_CONFIG, write_configmap

DEFAULT_PRESET = "a100-80gb-x8-mixed"
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"
_GI_IDS = (7, 8, 9, 11, 12, 13, 14)  # where an A100 places seven 1g.10gb instances

# The seed with its time-slicing moved onto the MIG resource: 16 replicas of each MIG device.
GPUS = 16
LARGE_CONFIG = SEED_CONFIG.replace("nvidia.com/gpu", MIG_RESOURCE).format(replicas=16)


@dataclass(frozen=True)
class NodeSetup:
    """What to pass to `serve` and what the kubelet should end up seeing."""

    simulate: str
    config_file: Path
    expected: dict[str, int]  # resource -> device IDs advertised


def swap_replicas(root: Path, replicas: int) -> Path:
    """Lay out or update the ConfigMap volume of `default_node` as the kubelet does (`..data`
    rename); returns the config file's path."""
    return write_configmap(root / "cm", SEED_CONFIG.format(replicas=replicas))


def default_node(root: Path) -> NodeSetup:
    """The preset with the seed ConfigMap (2 replicas), as a ConfigMap volume under <root>/cm."""
    return NodeSetup(
        DEFAULT_PRESET, swap_replicas(root, 2), {"nvidia.com/gpu": 8, MIG_RESOURCE: 28}
    )


def large_node(root: Path) -> NodeSetup:
    """16 A100s on NVSwitch, each cut into seven 1g.10gb instances, time-sliced 16 ways."""
    entries = []
    for i in range(GPUS):
        entries.append(
            {
                "uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000",
                "name": "NVIDIA A100-SXM4-80GB",
                "memoryMiB": 81920,
                "pciBusId": f"00000000:{0x10 + i:02X}:00.0",
                "index": i,
                "numaNode": i // (GPUS // 2),
                "computeCapability": "8.0",
                "migEnabled": True,
                "migDevices": [
                    {
                        "profile": "1g.10gb",
                        "uuid": f"MIG-{i:08x}-{gi:04x}-4000-8000-000000000000",
                        "gpuInstanceId": gi,
                        "computeInstanceId": 0,
                    }
                    for gi in _GI_IDS
                ],
                "nvswitchLinks": 12,
            }
        )
    node = root / "large-node.yaml"
    node.write_text(
        yaml.safe_dump(
            {"driverVersion": "550.90.07", "cudaDriverVersion": 12040, "gpus": entries},
            sort_keys=False,
        )
    )
    config = root / "large-config.yaml"
    config.write_text(LARGE_CONFIG)
    return NodeSetup(str(node), config, {MIG_RESOURCE: GPUS * len(_GI_IDS) * 16})
