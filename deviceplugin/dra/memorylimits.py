"""The cap on a memory share: the createContainer hook that sets it, and its clearing.

A share's CDI device carries a createContainer hook, `memory-limit-hook` (C, in
`node/native/`): runc runs it before pivot_root, on the host's loader, where a node has none of
our Python. It finds the container's cgroup, calls nvmlDeviceSetMemoryLimits_v1 with hard =
soft = the share, and first writes a record (claim, share, GPU, cgroup) into `memory-limits/`
beside the checkpoint. The hook's file must be a host path: the driver copies it from its image
into its plugin directory (a hostPath mounted at the same path) at start. Unprepare clears the
limits its records name through the driver's NVML, then drops the records, so a driver that
restarted in between still clears exactly what was set.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deviceplugin.model.errors import NvmlError
from deviceplugin.model.hostpaths import host_path
from deviceplugin.model.record import record

HOOK_FILE = "memory-limit-hook"
RECORDS_DIR = "memory-limits"
NVML_LIBRARY = "libnvidia-ml.so."


@record(frozen=True)
class LimitHook:
    """The installed hook, its records' directory and the NVML library it loads: host paths."""

    path: str
    records: str
    library: str

    def edit(self, claim_uid: str, share: str, gpu_uuid: str, limit: int) -> dict[str, Any]:
        """The CDI hook that caps one share (args as memory_limit_hook.c reads them)."""
        return {
            "hookName": "createContainer",
            "path": self.path,
            "args": [HOOK_FILE, self.library, self.records, claim_uid, share, gpu_uuid, str(limit)],
        }


def nvml_library(libraries: tuple[str, ...], driver_root: str) -> str | None:
    """The host path of the driver's libnvidia-ml (found by the host scan), or None."""
    for path in libraries:
        if os.path.basename(path).startswith(NVML_LIBRARY):
            return host_path(driver_root, path)
    return None


def install_hook(program: Path, directory: Path, library: str) -> LimitHook:
    """Copy `program` into `directory` (replaced atomically: a runtime may be running the old
    one) and make the records' directory. Raises OSError."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / HOOK_FILE
    scratch = directory / f".{HOOK_FILE}.{os.getpid()}"
    shutil.copyfile(program, scratch)
    scratch.chmod(0o755)
    scratch.replace(target)
    records = directory / RECORDS_DIR
    records.mkdir(mode=0o700, exist_ok=True)
    return LimitHook(str(target), str(records), library)


def clear_claim(records: Path, claim_uid: str, clear: Callable[[str, str], None]) -> str:
    """Clear every limit the hook recorded for a claim (`clear(gpu_uuid, cgroup)`), dropping
    each record once cleared; "" when none is left, else why (the kubelet retries)."""
    problems = []
    for path in sorted(records.glob(f"{claim_uid}_*.json")):
        try:
            entry = json.loads(path.read_text())
            clear(str(entry["gpu"]), str(entry["nameSpace"]))
            path.unlink()
        except (OSError, ValueError, KeyError, TypeError, NvmlError) as err:
            problems.append(f"clearing the memory limit recorded in {path}: {err}")
    return "; ".join(problems)
