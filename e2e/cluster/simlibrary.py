"""What a simulated driver root's libnvidia-ml.so.1 holds (MIG instances, compute modes), read
from the host as any NVML consumer reads it (testbed/simnvml.py), never from the driver's
checkpoint or CDI specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.simnvml import mig_layout, on_library


def mig_instances(driver_root: Path) -> list[dict[str, Any]]:
    """Every GPU instance the library under `driver_root` holds: its GPU's UUID and minor,
    profile id, placement, GI id, and the compute instance and MIG device UUID when it has one
    (None: a GPU instance alone)."""
    found = []
    for gpu in mig_layout(driver_root):
        migs = {m["gi"]: (m["ci"], m["uuid"]) for m in gpu["migDevices"]}
        for instance in gpu["gpuInstances"]:
            ci, uuid = migs.get(instance["id"], (None, None))
            start, size = instance["placement"]
            found.append(
                {
                    "gpu": gpu["uuid"],
                    "minor": gpu["minor"],
                    "profile": instance["profileId"],
                    "start": start,
                    "size": size,
                    "gi": instance["id"],
                    "ci": ci,
                    "uuid": uuid,
                }
            )
    return found


def compute_mode(driver_root: Path, uuid: str) -> int:
    """The compute mode the library under `driver_root` holds for the GPU `uuid`."""
    line = f"print(n.nvmlDeviceGetComputeMode(n.nvmlDeviceGetHandleByUUID({uuid!r})))"
    return int(on_library(driver_root, line))


def set_compute_mode(driver_root: Path, uuid: str, mode: int) -> None:
    """Set the compute mode of the GPU `uuid` in the library under `driver_root`, as an NVML
    client does."""
    handle = f"n.nvmlDeviceGetHandleByUUID({uuid!r})"
    on_library(driver_root, f"n.nvmlDeviceSetComputeMode({handle}, {mode})")
