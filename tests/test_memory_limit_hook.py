"""The memory-limit hook (`node/native/memory_limit_hook.c`) run as a runtime runs a
createContainer hook: a process with the container's OCI state on stdin, in the container's
cgroup (here: this test's own). Checked through the simulated libnvidia-ml.so.1 it loads: the
limit is set on its cgroup, a record names it, and a failure leaves neither."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as n
import pytest
from test_sim_library import opened
from test_sim_library_memory_limits import GIB, WHOLE_A100, get_limits, memory_total, own_cgroup

from deviceplugin.sim.hostroot import LIBRARY_DIR
from deviceplugin.sim.libbuild import hook_program

CLAIM = "0b5a7c2e-1f3d-4e6a-9b8c-7d6e5f4a3b2c"
SHARE = "4d3c2b1a-0f9e-4d8c-b7a6-5e4d3c2b1a0f"
STATE = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1, "bundle": "/b"}


@pytest.fixture
def root(tmp_path: Path, fresh_sim_root: Callable[[str, Path], Path]) -> Any:
    directory = fresh_sim_root("a100-80gb-x8-mixed", tmp_path / "root")
    (tmp_path / "records").mkdir()
    nvml = opened(directory)
    yield directory
    nvml.shutdown()


def hook(root: Path, gpu: str, limit: str, claim: str = CLAIM) -> subprocess.CompletedProcess[str]:
    library = root / LIBRARY_DIR / "libnvidia-ml.so.1"
    records = root.parent / "records"
    return subprocess.run(
        [str(hook_program()), str(library), str(records), claim, SHARE, gpu, limit],
        input=json.dumps(STATE),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root.parent / "records").iterdir())]


def test_the_hook_caps_its_own_cgroup_and_records_it(root: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(WHOLE_A100)
    uuid = n.nvmlDeviceGetUUID(gpu)
    done = hook(root, uuid, str(20 * GIB))
    assert done.returncode == 0, done.stderr
    assert get_limits(gpu, own_cgroup()) == (20 * GIB, 20 * GIB, 0)
    assert memory_total(gpu) == (20 * GIB, 20 * GIB)
    assert records(root) == [
        {"claim": CLAIM, "share": SHARE, "gpu": uuid, "nameSpace": own_cgroup(), "limit": 20 * GIB}
    ]
    (record,) = (root.parent / "records").iterdir()
    assert record.name.startswith(f"{CLAIM}_{SHARE}_") and record.suffix == ".json"


@pytest.mark.parametrize(
    ("gpu", "limit", "claim", "message"),
    [
        pytest.param("whole", "lots", CLAIM, "BYTES: want a positive whole number", id="bytes"),
        pytest.param("whole", "0", CLAIM, "BYTES: want a positive whole number", id="zero"),
        pytest.param("whole", str(GIB), "../x", "CLAIM_UID: want a UID", id="claim"),
        pytest.param("whole", str(81 * GIB), CLAIM, "Invalid Argument", id="above-total"),
        pytest.param("mig", str(GIB), CLAIM, "Not Supported", id="mig"),
        pytest.param("GPU-no-such", str(GIB), CLAIM, "nvmlDeviceGetHandleByUUID", id="unknown"),
    ],
)
def test_a_refused_limit_fails_the_hook_and_leaves_nothing(
    root: Path, gpu: str, limit: str, claim: str, message: str
) -> None:
    handle = n.nvmlDeviceGetHandleByIndex(WHOLE_A100)
    if gpu == "whole":
        gpu = n.nvmlDeviceGetUUID(handle)
    elif gpu == "mig":
        gpu = n.nvmlDeviceGetUUID(
            n.nvmlDeviceGetMigDeviceHandleByIndex(n.nvmlDeviceGetHandleByIndex(0), 0)
        )
    done = hook(root, gpu, limit, claim)
    assert done.returncode == 1
    assert done.stderr.startswith("memory-limit-hook: ") and message in done.stderr, done.stderr
    assert records(root) == []
    with pytest.raises(n.NVMLError_NotFound):
        get_limits(handle, own_cgroup())


def test_a_library_without_the_call_fails_the_hook(root: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(hook_program()),
            "/lib/x86_64-linux-gnu/libc.so.6",
            str(tmp_path / "records"),
            CLAIM,
            SHARE,
            "GPU-x",
            str(GIB),
        ],
        input="{}",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "lacks nvmlDeviceSetMemoryLimits_v1" in done.stderr, done.stderr
    assert list((tmp_path / "records").iterdir()) == []
