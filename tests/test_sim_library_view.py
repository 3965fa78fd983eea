"""A container sees only its GPUs: the simulated libnvidia-ml.so.1, loaded by nvidia-ml-py in a
fresh process from a container's tree (the library and its node where the CDI spec mounts them,
the sim-root's state folder shared, device nodes for some GPUs and MIG capabilities only),
enumerates only the GPUs and MIG devices whose nodes it holds, index 0 being the first GPU it
holds; the host's tree, with every node, and a tree with none are seen whole."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pynvml as n
import pytest
from test_sim_library import ANY_NODE, sim_root

from deviceplugin.model.hostpaths import capability_node
from deviceplugin.sim.hostroot import (
    EVENTS_FILE,
    LIBRARY_DIR,
    LIBRARY_NODE_FILE,
    mig_device_minors,
)
from deviceplugin.sim.node import Node, SimGpu, SimMig, read_node, resolve_node_path
from testbed.simnvml import mig_layout, on_library

PRESET = "a100-80gb-x8-mixed"  # GPUs 0 to 3 in MIG mode with seven 1g.10gb each, 4 to 7 whole
MIG_GPU = 1
CONFIG, MONITOR = 1, 2  # the mig/config and mig/monitor capability minors

# Each GPU by index, as NVML hands it out: UUID, index, minor, memory (v1 and v2); then lookups.
ENUMERATED = """
def outcome(call, *args):
    try:
        return n.nvmlDeviceGetIndex(call(*args))
    except n.NVMLError as err:
        return err.value
gpus = []
for index in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(index)
    v2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).total
    gpus.append([n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetIndex(h), n.nvmlDeviceGetMinorNumber(h),
                 n.nvmlDeviceGetMemoryInfo(h).total, v2])
print(json.dumps({
    "gpus": gpus,
    "past": outcome(n.nvmlDeviceGetHandleByIndex, len(gpus)),
    "byUuid": {u: outcome(n.nvmlDeviceGetHandleByUUID, u) for u in UUIDS},
    "byBus": {b: outcome(n.nvmlDeviceGetHandleByPciBusId, b) for b in BUSES},
}))
"""


@pytest.fixture(scope="module")
def a100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_root(PRESET, tmp_path_factory.mktemp("a100"))


@pytest.fixture(scope="module")
def node() -> Node:
    return read_node(resolve_node_path(PRESET))


def container(root: Path, where: Path, gpus: Iterable[int], caps: Iterable[int] = ()) -> Path:
    """The tree a container of a pod holding GPUs `gpus` (by minor) and MIG capabilities `caps`
    (by minor) sees, as the CDI spec makes it: the library and its node at the paths the host's
    have (copies, as the bind mounts are), the state folder shared, and those device nodes only
    (plain files: the library only looks for them)."""
    libraries = where / LIBRARY_DIR
    libraries.mkdir(parents=True)
    shutil.copyfile(root / LIBRARY_DIR / "libnvidia-ml.so.1", libraries / "libnvidia-ml.so.1")
    shutil.copyfile(root / LIBRARY_NODE_FILE, where / LIBRARY_NODE_FILE)
    (where / EVENTS_FILE).parent.parent.mkdir()
    (where / EVENTS_FILE).parent.symlink_to(root / EVENTS_FILE.rsplit("/", 1)[0])
    paths = [f"/dev/nvidia{minor}" for minor in gpus] + [capability_node(c) for c in caps]
    for path in paths:
        (where / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (where / path.lstrip("/")).touch()
    return where


def holding_mig(root: Path, where: Path, gpu: SimGpu, mig: SimMig, *more_caps: int) -> Path:
    """The tree of a container holding MIG device `mig` of `gpu`: the GPU's node and the
    MIG device's two capability nodes (and `more_caps`)."""
    caps = mig_device_minors(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
    return container(root, where, [gpu.minor], [*caps, *more_caps])


def enumerated(tree: Path, node: Node) -> dict[str, Any]:
    """What `ENUMERATED` prints on the library under `tree`, looking up every GPU of `node`."""
    lookups = (
        f"UUIDS = {[gpu.uuid for gpu in node.gpus]!r}",
        f"BUSES = {[gpu.pci_bus_id for gpu in node.gpus]!r}",
    )
    found: dict[str, Any] = json.loads(on_library(tree, *lookups, ENUMERATED))
    return found


def test_a_container_with_gpus_4_and_6_sees_two_gpus_4_first(
    a100: Path, node: Node, tmp_path: Path
) -> None:
    tree = container(a100, tmp_path, [4, 6])
    seen = enumerated(tree, node)
    four, six = node.gpus[4], node.gpus[6]
    assert seen["gpus"] == [
        [four.uuid, 0, 4, four.memory_mib << 20, four.memory_mib << 20],
        [six.uuid, 1, 6, six.memory_mib << 20, six.memory_mib << 20],
    ]
    assert seen["past"] == n.NVML_ERROR_INVALID_ARGUMENT
    hidden = {gpu.index: n.NVML_ERROR_NOT_FOUND for gpu in node.gpus}
    expected = [{**hidden, 4: 0, 6: 1}[gpu.index] for gpu in node.gpus]
    assert list(seen["byUuid"].values()) == expected
    assert list(seen["byBus"].values()) == expected


def test_the_host_and_a_tree_without_device_nodes_see_every_gpu(
    a100: Path, node: Node, tmp_path: Path
) -> None:
    every = [[g.uuid, g.index, g.minor, g.memory_mib << 20, g.memory_mib << 20] for g in node.gpus]
    for tree in (a100, container(a100, tmp_path, [])):
        seen = enumerated(tree, node)
        assert seen["gpus"] == every
        assert list(seen["byUuid"].values()) == [gpu.index for gpu in node.gpus]


def test_a_container_with_the_control_node_alone_sees_no_gpu(a100: Path, tmp_path: Path) -> None:
    """As the real driver: nvidiactl without a GPU's node is a container holding none."""
    tree = container(a100, tmp_path, [])
    (tree / "dev").mkdir()
    (tree / "dev" / "nvidiactl").touch()
    library = tree / LIBRARY_DIR / "libnvidia-ml.so.1"
    script = (
        f"import ctypes, os, pynvml as n; ctypes.CDLL({str(library)!r}, mode=os.RTLD_GLOBAL); "
        "n.nvmlInit(); print(n.nvmlDeviceGetCount())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr


def test_index_0_is_the_gpu_held_with_its_own_memory(tmp_path: Path) -> None:
    """GPUs of another model and size: the second of the node (minor 1, 48 GiB) alone."""
    (tmp_path / "node.yaml").write_text(ANY_NODE)
    root = sim_root(str(tmp_path / "node.yaml"), tmp_path / "root")
    node = read_node(tmp_path / "node.yaml")
    held = node.gpus[1]
    seen = enumerated(container(root, tmp_path / "pod", [held.minor]), node)
    assert seen["gpus"] == [[held.uuid, 0, held.minor, 48 << 30, 48 << 30]]


def test_a_mig_device_is_seen_only_with_its_capabilities(
    a100: Path, node: Node, tmp_path: Path
) -> None:
    gpu = node.gpus[MIG_GPU]
    mig = gpu.mig_devices[3]
    (layout,) = mig_layout(holding_mig(a100, tmp_path / "one", gpu, mig))
    assert (layout["index"], layout["uuid"], layout["minor"]) == (0, gpu.uuid, gpu.minor)
    assert layout["migDevices"] == [
        {"gi": mig.gpu_instance_id, "ci": mig.compute_instance_id, "uuid": mig.uuid}
    ]
    assert [gi["id"] for gi in layout["gpuInstances"]] == [mig.gpu_instance_id]
    assert [ci["id"] for ci in layout["gpuInstances"][0]["computeInstances"]] == [
        mig.compute_instance_id
    ]
    host = mig_layout(a100)[MIG_GPU]
    (monitored,) = mig_layout(container(a100, tmp_path / "all", [gpu.minor], [MONITOR]))
    assert len(host["migDevices"]) == len(gpu.mig_devices)
    assert {**monitored, "index": MIG_GPU} == host


def test_a_hidden_mig_device_is_not_found_nor_changed(
    a100: Path, node: Node, tmp_path: Path
) -> None:
    gpu = node.gpus[MIG_GPU]
    mine, other = gpu.mig_devices[0], gpu.mig_devices[1]
    script = f"""
def outcome(call, *args):
    try:
        call(*args)
        return "found"
    except n.NVMLError as err:
        return err.value
print(json.dumps([
    outcome(n.nvmlDeviceGetHandleByUUID, {mine.uuid!r}),
    outcome(n.nvmlDeviceGetHandleByUUID, {other.uuid!r}),
    outcome(n.nvmlDeviceGetMigDeviceHandleByIndex, gpu, 1),
    outcome(n.nvmlDeviceGetGpuInstanceById, gpu, {other.gpu_instance_id}),
    outcome(n.nvmlDeviceCreateGpuInstance, gpu, 19),
]))
"""
    assert json.loads(on_library(holding_mig(a100, tmp_path / "pod", gpu, mine), script)) == [
        "found",
        n.NVML_ERROR_NOT_FOUND,
        n.NVML_ERROR_NOT_FOUND,
        n.NVML_ERROR_NOT_FOUND,
        n.NVML_ERROR_NO_PERMISSION,
    ]
    with_config = holding_mig(a100, tmp_path / "config", gpu, mine, CONFIG)
    created = "print(n.nvmlDeviceCreateGpuInstance(gpu, 19) is not None)"
    with pytest.raises(RuntimeError, match="NVMLError_InsufficientResources"):
        on_library(with_config, created)  # allowed, and the GPU is full


def test_events_of_a_hidden_mig_device_are_not_delivered(
    a100: Path, node: Node, tmp_path: Path
) -> None:
    gpu = node.gpus[MIG_GPU]
    mine, other = gpu.mig_devices[2], gpu.mig_devices[5]
    lines = [{"uuid": other.uuid, "xid": 31}, {"uuid": mine.uuid, "xid": 43}]
    script = f"""
events = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(gpu, n.nvmlEventTypeXidCriticalError, events)
with open({str(a100 / EVENTS_FILE)!r}, "a") as stream:
    stream.write("".join(json.dumps(line) + "\\n" for line in {lines!r}))
data = n.nvmlEventSetWait_v2(events, 10000)
print(json.dumps([data.eventData, data.gpuInstanceId, data.computeInstanceId]))
"""
    assert json.loads(on_library(holding_mig(a100, tmp_path, gpu, mine), script)) == [
        43,
        mine.gpu_instance_id,
        mine.compute_instance_id,
    ]
