"""A simulated driver root's libnvidia-ml.so.1, read (or changed) from outside as any NVML
consumer does: nvidia-ml-py in a fresh Python process on that root's library. What the library
holds (compute modes, MIG instances) lives under the root, shared by every process that loads
it there, so a test sees what a driver or plugin left, never what they say they did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from deviceplugin.sim.hostroot import LIBRARY_DIR

# Every GPU: its index, UUID, minor, MIG mode (None: not MIG-capable), its GPU instances (each
# with its compute instances) in profile order, and its MIG devices in slot order.
_MIG_LAYOUT = """
layout = []
for index in range(n.nvmlDeviceGetCount()):
    gpu = n.nvmlDeviceGetHandleByIndex(index)
    try:
        mode = n.nvmlDeviceGetMigMode(gpu)[0]
    except n.NVMLError:
        mode = None
    instances, seen, migs = [], set(), []
    for enum in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT if mode else 0):
        try:
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(gpu, enum)
        except n.NVMLError:
            continue
        if info.id in seen:
            continue
        seen.add(info.id)
        gis = (n.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(info.instanceCount)
        n.nvmlDeviceGetGpuInstances(gpu, info.id, gis, ctypes.byref(count))
        for gi in gis[: count.value]:
            g = n.nvmlGpuInstanceGetInfo(gi)
            cis = []
            for ci_enum in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                try:
                    ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_enum, 0)
                except n.NVMLError:
                    continue
                buffer = (n.c_nvmlComputeInstance_t * ci_info.instanceCount)()
                ci_count = ctypes.c_uint(ci_info.instanceCount)
                n.nvmlGpuInstanceGetComputeInstances(gi, ci_info.id, buffer, ctypes.byref(ci_count))
                for ci in buffer[: ci_count.value]:
                    c = n.nvmlComputeInstanceGetInfo(ci)
                    place = [c.placement.start, c.placement.size]
                    cis.append({"profileId": c.profileId, "placement": place, "id": c.id})
            place = [g.placement.start, g.placement.size]
            instances.append(
                {"profileId": g.profileId, "placement": place, "id": g.id, "computeInstances": cis}
            )
    for slot in range(n.nvmlDeviceGetMaxMigDeviceCount(gpu) if mode else 0):
        try:
            mig = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
        except n.NVMLError_NotFound:
            continue
        migs.append({"gi": n.nvmlDeviceGetGpuInstanceId(mig),
                     "ci": n.nvmlDeviceGetComputeInstanceId(mig), "uuid": n.nvmlDeviceGetUUID(mig)})
    layout.append({"index": index, "uuid": n.nvmlDeviceGetUUID(gpu),
                   "minor": n.nvmlDeviceGetMinorNumber(gpu), "migMode": mode,
                   "gpuInstances": instances, "migDevices": migs})
print(json.dumps(layout))
"""


def on_library(driver_root: Path, *lines: str, timeout: float = 60) -> str:
    """The output of `lines`, run by a fresh Python on the library under `driver_root`, with
    nvidia-ml-py as `n`, `ctypes` and `json` imported and `gpu` GPU 0's handle. Raises
    RuntimeError with the process's error output when it fails."""
    library = driver_root / LIBRARY_DIR / "libnvidia-ml.so.1"
    script = "\n".join(
        (
            "import ctypes, json, os, pynvml as n",
            f"ctypes.CDLL({str(library)!r}, mode=os.RTLD_GLOBAL)",
            "n.nvmlInit()",
            "gpu = n.nvmlDeviceGetHandleByIndex(0)",
            *lines,
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"reading {library} with nvidia-ml-py: {done.stderr.strip()}")
    return done.stdout


def mig_layout(driver_root: Path) -> list[dict[str, Any]]:
    """Every GPU of the library under `driver_root` as `_MIG_LAYOUT` describes it."""
    found: list[dict[str, Any]] = json.loads(on_library(driver_root, _MIG_LAYOUT))
    return found
