"""Per-cgroup GPU memory limits at the simulated libnvidia-ml.so.1's ABI, through nvidia-ml-py
loading it from a `sim-root`: set, read back and cleared; shared by every process on the root;
reported by nvmlDeviceGetMemoryInfo_v2 inside the limited cgroup and its descendants only; MIG
handles and values NVML refuses are refused with NVML's codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml as n
import pytest
from test_sim_library import opened, sim_root

from deviceplugin.sim.hostroot import LIBRARY_DIR

GIB = 1 << 30
LIMITS_FILE = "etc/deviceplugin-sim/memory-limits.json"
WHOLE_A100 = 4  # a100-80gb-x8-mixed: GPUs 4 to 7 are whole 80 GiB GPUs; 0 to 3 hold MIG devices


def own_cgroup() -> str:
    """The rule the library documents: the v1 `memory` controller's path under
    /sys/fs/cgroup/memory when there is one, else the v2 `0::` path under /sys/fs/cgroup."""
    lines = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            return f"/sys/fs/cgroup/memory{path}".rstrip("/")
    return next(f"/sys/fs/cgroup{path}".rstrip("/") for hid, _, path in lines if hid == "0")


@pytest.fixture
def root(tmp_path: Path) -> Any:
    directory = sim_root("a100-80gb-x8-mixed", tmp_path / "root")
    nvml = opened(directory)
    yield directory
    nvml.shutdown()


def set_limits(handle: Any, space: str, soft: int, hard: int) -> None:
    limits = n.c_nvmlSetMemoryLimits_v1_t()
    limits.nameSpace, limits.softLimit, limits.hardLimit = space.encode(), soft, hard
    n.nvmlDeviceSetMemoryLimits_v1(handle, limits)


def get_limits(handle: Any, space: str) -> tuple[int, int, int]:
    limits = n.c_nvmlGetMemoryLimits_v1_t()
    limits.nameSpace = space.encode()
    n.nvmlDeviceGetMemoryLimits_v1(handle, limits)
    return limits.softLimit, limits.hardLimit, limits.currentUsed


def clear(handle: Any, space: str) -> None:
    set_limits(handle, space, 0, n.NVML_DEVICE_MEMORY_LIMIT_MAX)


def error_of(call: Any, *arguments: Any) -> int:
    with pytest.raises(n.NVMLError) as caught:
        call(*arguments)
    return int(caught.value.value)


def memory_total(handle: Any) -> tuple[int, int]:
    info = n.nvmlDeviceGetMemoryInfo(handle, version=n.nvmlMemory_v2)
    return info.total, info.free


def test_a_limit_is_set_read_back_and_cleared(root: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE_A100)
    space = own_cgroup()
    assert error_of(get_limits, gpu, space) == n.NVML_ERROR_NOT_FOUND
    set_limits(gpu, space, 10 * GIB, 20 * GIB)
    assert get_limits(gpu, space + "/") == (10 * GIB, 20 * GIB, 0)
    set_limits(gpu, space, 20 * GIB, 20 * GIB)  # a second set replaces the first
    assert get_limits(gpu, space) == (20 * GIB, 20 * GIB, 0)
    saved = json.loads((root / LIMITS_FILE).read_text())
    assert saved["limits"] == [
        {
            "uuid": n.nvmlDeviceGetUUID(gpu),
            "nameSpace": space,
            "softLimit": 20 * GIB,
            "hardLimit": 20 * GIB,
        }
    ]
    other = n.nvmlDeviceGetHandleByIndex(WHOLE_A100 + 1)
    assert error_of(get_limits, other, space) == n.NVML_ERROR_NOT_FOUND  # per GPU
    clear(gpu, space)
    assert error_of(get_limits, gpu, space) == n.NVML_ERROR_NOT_FOUND
    clear(gpu, space)  # clearing what is not set is no error
    assert json.loads((root / LIMITS_FILE).read_text())["limits"] == []


def test_memory_info_v2_reports_the_smallest_limit_of_the_callers_cgroup_and_its_parents(
    root: Path, tmp_path: Path
) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE_A100)
    whole = 80 * GIB
    assert memory_total(gpu) == (whole, whole)
    set_limits(gpu, str(tmp_path), 0, 10 * GIB)  # a limit on another cgroup is not ours
    assert memory_total(gpu) == (whole, whole)
    parent = str(Path(own_cgroup()).parent)
    set_limits(gpu, parent, 0, 30 * GIB)  # a pod's cgroup holds its containers'
    assert memory_total(gpu) == (30 * GIB, 30 * GIB)
    set_limits(gpu, own_cgroup(), 20 * GIB, 20 * GIB)
    assert memory_total(gpu) == (20 * GIB, 20 * GIB)
    set_limits(gpu, own_cgroup(), 40 * GIB, 40 * GIB)
    assert memory_total(gpu) == (30 * GIB, 30 * GIB)
    assert n.nvmlDeviceGetMemoryInfo(gpu).total == whole  # the v1 call knows no cgroups
    assert memory_total(n.nvmlDeviceGetHandleByIndex(WHOLE_A100 + 1)) == (whole, whole)
    clear(gpu, own_cgroup())
    clear(gpu, parent)
    assert memory_total(gpu) == (whole, whole)


def in_process(root: Path, *lines: str) -> str:
    """`lines` run by a fresh Python on `root`'s library, with GPU WHOLE_A100 as `gpu`."""
    script = "\n".join(
        (
            "import ctypes, os, pynvml as n",
            f"ctypes.CDLL({str(root / LIBRARY_DIR / 'libnvidia-ml.so.1')!r}, mode=os.RTLD_GLOBAL)",
            "n.nvmlInit()",
            f"gpu = n.nvmlDeviceGetHandleByIndex({WHOLE_A100})",
            *lines,
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_limits_are_shared_by_every_process_on_the_root(root: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE_A100)
    assert memory_total(gpu)[0] == 80 * GIB  # this process has read the file already
    set_in_child = (
        "l = n.c_nvmlSetMemoryLimits_v1_t()",
        f"l.nameSpace, l.softLimit, l.hardLimit = {own_cgroup()!r}.encode(), {5 * GIB}, {6 * GIB}",
        "n.nvmlDeviceSetMemoryLimits_v1(gpu, l)",
    )
    in_process(root, *set_in_child)
    assert get_limits(gpu, own_cgroup()) == (5 * GIB, 6 * GIB, 0)
    assert memory_total(gpu) == (6 * GIB, 6 * GIB)
    shown = in_process(root, "print(n.nvmlDeviceGetMemoryInfo(gpu, version=n.nvmlMemory_v2).total)")
    assert int(shown) == 6 * GIB  # the child is in the same cgroup
    clear(gpu, own_cgroup())
    shown = in_process(root, "print(n.nvmlDeviceGetMemoryInfo(gpu, version=n.nvmlMemory_v2).total)")
    assert int(shown) == 80 * GIB


def test_mig_handles_are_not_supported(root: Path) -> None:
    mig = n.nvmlDeviceGetMigDeviceHandleByIndex(n.nvmlDeviceGetHandleByIndex(0), 0)
    assert error_of(set_limits, mig, own_cgroup(), GIB, GIB) == n.NVML_ERROR_NOT_SUPPORTED
    assert error_of(get_limits, mig, own_cgroup()) == n.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize(
    ("space", "soft", "hard", "error"),
    [
        pytest.param(None, 2 * GIB, GIB, n.NVML_ERROR_INVALID_ARGUMENT, id="soft-above-hard"),
        pytest.param(None, 0, 81 * GIB, n.NVML_ERROR_INVALID_ARGUMENT, id="above-total-memory"),
        pytest.param(None, GIB, n.NVML_DEVICE_MEMORY_LIMIT_MAX, n.NVML_ERROR_INVALID_ARGUMENT,
                     id="no-hard-limit-with-a-soft-one"),
        pytest.param("relative/path", 0, GIB, n.NVML_ERROR_INVALID_ARGUMENT, id="relative-path"),
        pytest.param("/sys/fs/cgroup/no-such-cgroup", 0, GIB, n.NVML_ERROR_OPERATING_SYSTEM,
                     id="no-such-cgroup"),
    ],
)  # fmt: skip
def test_values_nvml_refuses_are_refused(
    root: Path, space: str | None, soft: int, hard: int, error: int
) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE_A100)
    assert error_of(set_limits, gpu, space or own_cgroup(), soft, hard) == error
    assert not (root / LIMITS_FILE).exists()  # nothing recorded


def test_a_gpu_whose_nvml_lacks_the_call_answers_not_supported(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(
        "gpus:\n"
        "  - uuid: GPU-8e2f3c10-0000-4000-8000-000000000000\n"
        "    name: NVIDIA A100-SXM4-80GB\n"
        "    memoryMiB: 81920\n"
        '    pciBusId: "00000000:07:00.0"\n'
        "    notSupported: [nvmlDeviceSetMemoryLimits_v1, nvmlDeviceGetMemoryLimits_v1]\n"
    )
    nvml = opened(sim_root(str(node), tmp_path / "root"))
    gpu = n.nvmlDeviceGetHandleByIndex(0)
    assert error_of(set_limits, gpu, own_cgroup(), GIB, GIB) == n.NVML_ERROR_NOT_SUPPORTED
    assert error_of(get_limits, gpu, own_cgroup()) == n.NVML_ERROR_NOT_SUPPORTED
    nvml.shutdown()


def test_a_malformed_limits_file_is_ignored(root: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE_A100)
    (root / LIMITS_FILE).write_text('{"format": 1, "limits": [{"uuid": 3}]}')
    assert memory_total(gpu) == (80 * GIB, 80 * GIB)
    set_limits(gpu, own_cgroup(), GIB, GIB)  # a change rewrites it whole
    assert memory_total(gpu) == (GIB, GIB)
    clear(gpu, own_cgroup())
