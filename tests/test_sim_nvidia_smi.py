"""The simulated `nvidia-smi` that `sim-root` installs: `-i ID -c MODE` sets the compute mode
where every NVML consumer of the node reads it (NVIDIA's MPS daemon sets it this way), refuses
what NVIDIA's tool refuses, and on a GPU in MIG mode warns and goes on as NVIDIA's does; anything
else prints one line, as the placeholder it replaces did."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_sim_compute_mode import WHOLE, mode_elsewhere
from test_sim_library import sim_root

from deviceplugin.sim.hostroot import NVIDIA_SMI
from testbed.simnvml import on_library

EXCLUSIVE_PROCESS, DEFAULT = 3, 0


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_root("a100-80gb-x8-mixed", tmp_path_factory.mktemp("smi") / "root")


def smi(root: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run from another directory with a bare environment: it finds its driver root's NVML."""
    return subprocess.run(
        [str(root / NVIDIA_SMI), *arguments],
        capture_output=True, text=True, check=False, env={}, cwd="/",
    )  # fmt: skip


def uuid_of(root: Path, index: int) -> str:
    return on_library(
        root, f"print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex({index})))"
    ).strip()


def test_sets_a_gpus_mode_by_uuid_for_every_process(root: Path) -> None:
    uuid = uuid_of(root, WHOLE)
    done = smi(root, "-i", uuid, "-c", "EXCLUSIVE_PROCESS")
    assert done.returncode == 0, done.stderr
    assert "Set compute mode to EXCLUSIVE_PROCESS" in done.stdout
    assert mode_elsewhere(root, WHOLE) == EXCLUSIVE_PROCESS
    assert mode_elsewhere(root, WHOLE + 1) == DEFAULT
    assert smi(root, "-i", uuid, "-c", "0").returncode == 0
    assert mode_elsewhere(root, WHOLE) == DEFAULT


def test_sets_by_index_and_mode_number(root: Path) -> None:
    assert smi(root, "-i", str(WHOLE + 1), "-c", "3").returncode == 0
    assert mode_elsewhere(root, WHOLE + 1) == EXCLUSIVE_PROCESS
    assert smi(root, "-i", str(WHOLE + 1), "-c", "DEFAULT").returncode == 0


@pytest.mark.parametrize(
    ("arguments", "status"),
    [
        pytest.param(("-i", "4", "-c", "EXCLUSIVE_THREAD"), 2, id="mode-gone-from-nvml"),
        pytest.param(("-i", "4", "-c", "1"), 2, id="mode-number-gone"),
        pytest.param(("-i", "99", "-c", "3"), 2, id="no-such-gpu"),
        pytest.param(("-i", "GPU-00000000-0000-0000-0000-000000000000", "-c", "3"), 2, id="uuid"),
    ],
)
def test_refuses_what_it_cannot_do(root: Path, arguments: tuple[str, ...], status: int) -> None:
    done = smi(root, *arguments)
    assert done.returncode == status
    assert done.stderr
    assert mode_elsewhere(root, WHOLE) == DEFAULT


def test_anything_else_answers_as_the_placeholder_did(root: Path) -> None:
    """A pod's `nvidia-smi -L` must not fail where the node file is out of its sight."""
    for arguments in ((), ("-L",), ("-i", "0")):
        done = smi(root, *arguments)
        assert done.returncode == 0
        assert done.stdout.startswith("simulated nvidia-smi")


def test_a_gpu_in_mig_mode_is_a_warning_not_a_failure(root: Path) -> None:
    done = smi(root, "-i", "0", "-c", "EXCLUSIVE_PROCESS")
    assert done.returncode == 0
    assert "not supported on a MIG-enabled device" in done.stdout
    assert "Treating as warning and moving on." in done.stdout
