"""Compute modes at the simulated libnvidia-ml.so.1's ABI, through nvidia-ml-py: set in one
process, seen in every other on the same sim-root (as an MPS control daemon needs its GPUs in
EXCLUSIVE_PROCESS), refused as NVML refuses them, forgotten by `sim-root` again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as n
import pytest
from test_sim_library import opened, sim_root

from deviceplugin.sim.hostroot import COMPUTE_MODE_FILE
from testbed.simnvml import on_library

WHOLE = 4  # a100-80gb-x8-mixed: GPUs 0 to 3 have MIG on, 4 to 7 are whole


@pytest.fixture
def a100(tmp_path: Path, fresh_sim_root: Callable[[str, Path], Path]) -> Any:
    root = fresh_sim_root("a100-80gb-x8-mixed", tmp_path / "root")
    nvml = opened(root)
    yield root
    nvml.shutdown()


def mode_elsewhere(root: Path, index: int, *lines: str) -> int:
    """GPU `index`'s compute mode as a fresh process on `root` reads it, after `lines`."""
    out = on_library(
        root,
        f"gpu = n.nvmlDeviceGetHandleByIndex({index})",
        *lines,
        "print(n.nvmlDeviceGetComputeMode(gpu))",
    )
    return int(out)


def test_every_device_starts_in_default(a100: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE)
    assert n.nvmlDeviceGetComputeMode(gpu) == n.NVML_COMPUTEMODE_DEFAULT
    mig = n.nvmlDeviceGetMigDeviceHandleByIndex(n.nvmlDeviceGetHandleByIndex(0), 0)
    assert n.nvmlDeviceGetComputeMode(mig) == n.NVML_COMPUTEMODE_DEFAULT


def test_a_mode_set_here_is_seen_by_another_process_and_back(a100: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE)
    n.nvmlDeviceSetComputeMode(gpu, n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert n.nvmlDeviceGetComputeMode(gpu) == n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert mode_elsewhere(a100, WHOLE) == n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert mode_elsewhere(a100, WHOLE + 1) == n.NVML_COMPUTEMODE_DEFAULT
    restored = mode_elsewhere(
        a100, WHOLE, f"n.nvmlDeviceSetComputeMode(gpu, {n.NVML_COMPUTEMODE_DEFAULT})"
    )
    assert restored == n.NVML_COMPUTEMODE_DEFAULT
    assert n.nvmlDeviceGetComputeMode(gpu) == n.NVML_COMPUTEMODE_DEFAULT


def test_two_processes_changing_two_gpus_keep_both(a100: Path) -> None:
    n.nvmlDeviceSetComputeMode(n.nvmlDeviceGetHandleByIndex(WHOLE), n.NVML_COMPUTEMODE_PROHIBITED)
    mode_elsewhere(a100, WHOLE + 1, "n.nvmlDeviceSetComputeMode(gpu, 3)")
    assert n.nvmlDeviceGetComputeMode(n.nvmlDeviceGetHandleByIndex(WHOLE)) == 2
    assert n.nvmlDeviceGetComputeMode(n.nvmlDeviceGetHandleByIndex(WHOLE + 1)) == 3


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(n.NVML_COMPUTEMODE_EXCLUSIVE_THREAD, id="exclusive-thread-removed"),
        pytest.param(n.NVML_COMPUTEMODE_COUNT, id="past-the-enum"),
    ],
)
def test_modes_nvml_does_not_have_are_refused(a100: Path, mode: int) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceSetComputeMode(gpu, mode)
    assert n.nvmlDeviceGetComputeMode(gpu) == n.NVML_COMPUTEMODE_DEFAULT


def test_a_mig_enabled_gpu_takes_its_mode_on_its_mig_devices(a100: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceSetComputeMode(gpu, n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetComputeMode(gpu)
    mig = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    n.nvmlDeviceSetComputeMode(mig, n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert n.nvmlDeviceGetComputeMode(mig) == n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    other = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    assert n.nvmlDeviceGetComputeMode(other) == n.NVML_COMPUTEMODE_DEFAULT


def test_a_lost_gpu_says_so(a100: Path) -> None:
    from test_sim_library import append

    uuid = n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(WHOLE))
    append(a100, {"uuid": uuid, "lost": True})
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceSetComputeMode(n.nvmlDeviceGetHandleByIndex(WHOLE), 3)


def test_a_malformed_state_file_is_ignored_and_the_last_good_one_kept(
    a100: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE)
    n.nvmlDeviceSetComputeMode(gpu, n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    state = a100 / COMPUTE_MODE_FILE
    assert '"modes": {' in state.read_text()
    state.write_text('{"format": 1, "modes": {"GPU-x": 1}}')
    assert n.nvmlDeviceGetComputeMode(gpu) == n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert "compute-mode state" in capfd.readouterr().err


def test_sim_root_again_forgets_the_modes(tmp_path: Path) -> None:
    """Changed by another process: this one keeps no copy of the library, which sim-root
    rewrites."""
    root = sim_root("a100-80gb-x8-mixed", tmp_path)
    assert mode_elsewhere(root, WHOLE, "n.nvmlDeviceSetComputeMode(gpu, 3)") == 3
    assert (root / COMPUTE_MODE_FILE).is_file()
    sim_root("a100-80gb-x8-mixed", root)
    assert not (root / COMPUTE_MODE_FILE).exists()
    assert mode_elsewhere(root, WHOLE) == n.NVML_COMPUTEMODE_DEFAULT
