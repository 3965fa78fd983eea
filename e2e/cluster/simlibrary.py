"""The MIG instances a simulated driver root's libnvidia-ml.so.1 holds, read from the host as any
NVML consumer reads them: nvidia-ml-py in a fresh Python process on that root's library (the
layout lives under the root, shared by every process that loads it), never from the driver's
checkpoint or CDI specs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from deviceplugin.sim.hostroot import LIBRARY_DIR

# Every GPU instance of every GPU: its GPU's UUID and minor, profile id, placement, GI id, and
# the compute instance and MIG device UUID when it has one (None: a GPU instance alone).
_READ = """
found = []
for index in range(n.nvmlDeviceGetCount()):
    gpu = n.nvmlDeviceGetHandleByIndex(index)
    parent, minor = n.nvmlDeviceGetUUID(gpu), n.nvmlDeviceGetMinorNumber(gpu)
    migs = {}
    for slot in range(n.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            mig = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
        except n.NVMLError_NotFound:
            continue
        gi = n.nvmlDeviceGetGpuInstanceId(mig)
        migs[gi] = (n.nvmlDeviceGetComputeInstanceId(mig), n.nvmlDeviceGetUUID(mig))
    seen = set()
    for enum in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(gpu, enum)
        except n.NVMLError:
            continue
        if info.id in seen:
            continue
        seen.add(info.id)
        buffer = (n.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(info.instanceCount)
        n.nvmlDeviceGetGpuInstances(gpu, info.id, buffer, ctypes.byref(count))
        for handle in buffer[: count.value]:
            i = n.nvmlGpuInstanceGetInfo(handle)
            ci, uuid = migs.get(i.id, (None, None))
            found.append({"gpu": parent, "minor": minor, "profile": i.profileId,
                          "start": i.placement.start, "size": i.placement.size,
                          "gi": i.id, "ci": ci, "uuid": uuid})
print(json.dumps(found))
"""


def mig_instances(driver_root: Path) -> list[dict[str, Any]]:
    """Every GPU instance the library under `driver_root` holds, as `_READ` describes them."""
    found: list[dict[str, Any]] = json.loads(_run(driver_root, "import json", _READ))
    return found


def compute_mode(driver_root: Path, uuid: str) -> int:
    """The compute mode the library under `driver_root` holds for the GPU `uuid`."""
    line = f"print(n.nvmlDeviceGetComputeMode(n.nvmlDeviceGetHandleByUUID({uuid!r})))"
    return int(_run(driver_root, line))


def set_compute_mode(driver_root: Path, uuid: str, mode: int) -> None:
    """Set the compute mode of the GPU `uuid` in the library under `driver_root`, as an NVML
    client does."""
    handle = f"n.nvmlDeviceGetHandleByUUID({uuid!r})"
    _run(driver_root, f"n.nvmlDeviceSetComputeMode({handle}, {mode})")


def _run(driver_root: Path, *lines: str) -> str:
    """The output of `lines`, run by a fresh Python with nvidia-ml-py (`n`) on the library."""
    library = driver_root / LIBRARY_DIR / "libnvidia-ml.so.1"
    script = "\n".join(
        (
            "import ctypes, os, pynvml as n",
            f"ctypes.CDLL({str(library)!r}, mode=os.RTLD_GLOBAL)",
            "n.nvmlInit()",
            *lines,
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"reading {library} with nvidia-ml-py: {done.stderr.strip()}")
    return done.stdout
