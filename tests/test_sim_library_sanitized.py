"""The simulated libnvidia-ml.so.1's sources under AddressSanitizer and UBSan, and under
ThreadSanitizer: a C driver (tests/native/simlib_selftest.c) calls every modelled function from
nine threads while events are appended, and feeds the JSON reader every prefix of a node file,
on the host's view and on a container's (device nodes for some GPUs and MIG devices only). Any
leak, overflow, use after free, undefined behaviour or data race fails it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_sim_library import sim_root

from deviceplugin.model.hostpaths import capability_node
from deviceplugin.sim.hostroot import EVENTS_FILE, LIBRARY_NODE_FILE, mig_device_minors
from deviceplugin.sim.libbuild import sanitized_program
from deviceplugin.sim.node import read_node, resolve_node_path

SELFTEST = Path(__file__).parent / "native" / "simlib_selftest.c"


@pytest.fixture(scope="module", params=["address", "thread"])
def selftest(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    return sanitized_program(SELFTEST, folder / "simlib_selftest", request.param)


@pytest.mark.parametrize("preset", ["a100-80gb-x8-mixed", "a30-x4-mig", "dgx1-hybrid-cube"])
def test_the_library_is_clean_under_sanitizers(preset: str, selftest: Path, tmp_path: Path) -> None:
    run_selftest(selftest, sim_root(preset, tmp_path / "root"))


def test_a_containers_view_is_clean_under_sanitizers(selftest: Path, tmp_path: Path) -> None:
    """Every other GPU of the node, and the first MIG device of each of those."""
    preset = "a100-80gb-x8-mixed"
    dev = tmp_path / "dev"
    nodes = []
    for gpu in read_node(resolve_node_path(preset)).gpus[1::2]:
        nodes.append(f"/dev/nvidia{gpu.minor}")
        for mig in gpu.mig_devices[:1]:
            minors = mig_device_minors(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
            nodes += [capability_node(minor) for minor in minors]
    for path in nodes:
        (dev / path.removeprefix("/dev/")).parent.mkdir(parents=True, exist_ok=True)
        (dev / path.removeprefix("/dev/")).touch()
    run_selftest(selftest, sim_root(preset, tmp_path / "root"), DEVICEPLUGIN_SIM_DEV=str(dev))


def run_selftest(selftest: Path, root: Path, **settings: str) -> None:
    environment = {
        **os.environ,
        **settings,
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "TSAN_OPTIONS": "halt_on_error=1",
    }
    done = subprocess.run(
        [str(selftest), str(root / LIBRARY_NODE_FILE), str(root / EVENTS_FILE)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert "all checks passed" in done.stdout
    assert "runtime error" not in done.stderr
    assert "WARNING: ThreadSanitizer" not in done.stderr
