"""The cap on a memory share: the createContainer hook that sets it, and its clearing.

A share's CDI device carries a createContainer hook, `memory-limit-hook` (C, in
`node/native/`): runc runs it before pivot_root, on the host's loader, where a node has none of
our Python. It finds the container's pod cgroup (the containers of a pod that use a share are
capped as one), calls nvmlDeviceSetMemoryLimits_v1 with hard = soft = the shares recorded there
for the GPU, and first writes a record (claim, share, GPU, cgroup, limit) into `memory-limits/`
beside the checkpoint, one per GPU and cgroup. The hook's file must be a host path: the driver
copies it from its image into its plugin directory (a hostPath mounted at the same path) at
start. Unprepare takes back the limits its records name through the driver's NVML, then drops
the records, so a driver that restarted in between still clears exactly what was set.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deviceplugin.model.errors import NvmlError
from deviceplugin.model.hostpaths import host_path
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record

logger = logging.getLogger(__name__)

HOOK_FILE = "memory-limit-hook"
RECORDS_DIR = "memory-limits"
LOCK_FILE = ".lock"  # in RECORDS_DIR: the flock memory_limit_hook.c takes (LOCK_FILE there too)
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


def clear_claim(
    records: Path, claim_uid: str, limit: Callable[[str, str, int | None], None]
) -> str:
    """Take back every cap the hook recorded for a claim, dropping each record once done: the
    cgroup's limit on the GPU becomes what other claims' records there sum to (their shares in
    the same pod), else none (`limit(gpu_uuid, cgroup, bytes or None)`). "" when none of the
    claim's records is left, else why (the kubelet retries). Under the hooks' lock, so that a
    hook and this never set one cgroup's cap from totals the other is changing."""
    path = records / LOCK_FILE
    try:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        return f"locking the memory-limit records {path}: {err}"
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _clear_locked(records, claim_uid, limit)
    finally:
        os.close(lock)


def _clear_locked(
    records: Path, claim_uid: str, limit: Callable[[str, str, int | None], None]
) -> str:
    problems, mine, others = [], [], Counter[tuple[str, str]]()
    for path in sorted(records.glob("*.json")):
        ours = path.name.startswith(f"{claim_uid}_")
        try:
            gpu, cgroup, size = _read_record(path)
        except (OSError, ValueError, KeyError, TypeError) as err:
            if ours:
                problems.append(f"reading the memory-limit record {path}: {err}")
            else:  # its own Unprepare reports it; here its share is not set back
                log_event(
                    logger,
                    "dra.limit_record.unreadable",
                    logging.WARNING,
                    path=str(path),
                    error=str(err),
                    detail="another claim's record, skipped: its share is not counted",
                )
            continue
        if ours:
            mine.append((path, gpu, cgroup))
        else:
            others[gpu, cgroup] += size
    for path, gpu, cgroup in mine:
        try:
            limit(gpu, cgroup, others.get((gpu, cgroup)))
            path.unlink()
        except (OSError, NvmlError) as err:
            problems.append(f"clearing the memory limit recorded in {path}: {err}")
    return "; ".join(problems)


def _read_record(path: Path) -> tuple[str, str, int]:
    """A record's GPU UUID, cgroup and limit. Raises OSError, ValueError, KeyError, TypeError."""
    entry = json.loads(path.read_text())
    return str(entry["gpu"]), str(entry["nameSpace"]), int(entry["limit"])
