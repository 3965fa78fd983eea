"""The simulated libnvidia-ml.so.1 at the driver's ABI: loaded by the real nvidia-ml-py from a
`sim-root` tree (and by raw ctypes), it must say exactly what the node file says, deliver
appended events, fail as NVML fails, and keep our production path identical to `--simulate`."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from suites import first_quick

from deviceplugin.model.errors import NvmlError
from deviceplugin.node.nvml import Nvml, driver_library, real_nvml
from deviceplugin.sim import libbuild
from deviceplugin.sim.fake_nvml import switch_bus_id
from deviceplugin.sim.hostroot import EVENTS_FILE, LIBRARY_DIR, LIBRARY_NODE_FILE
from deviceplugin.sim.libbuild import declared_functions, nvml_header
from deviceplugin.sim.node import Node, preset_names, read_node, resolve_node_path

NOT_SUPPORTED = 3
# Beyond the presets: a compute-instance subprofile, +me with another driver's memory size, a
# model without a published profile table, no NUMA node, NVLink peers and NVSwitch links.
ANY_NODE = """\
driverVersion: "570.124.06"
cudaDriverVersion: 12080
gpus:
  - uuid: GPU-11111111-0000-4000-8000-000000000000
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    pciBusId: "00000000:1a:00.0"
    minor: 3
    computeCapability: "8.0"
    migEnabled: true
    migCapable: true
    migDevices:
      - profile: 2c.3g.40gb
        uuid: MIG-11111111-0001-4000-8000-000000000000
        gpuInstanceId: 1
        computeInstanceId: 0
      - profile: 1c.3g.40gb
        uuid: MIG-11111111-0002-4000-8000-000000000000
        gpuInstanceId: 1
        computeInstanceId: 1
      - profile: 1g.10gb+me
        uuid: MIG-11111111-0003-4000-8000-000000000000
        gpuInstanceId: 9
        computeInstanceId: 0
        memoryMiB: 9856
    nvlinkPeers: [1, 1]
  - uuid: GPU-22222222-0000-4000-8000-000000000000
    name: NVIDIA Made-Up 48GB
    memoryMiB: 49152
    pciBusId: "00000000:2B:00.0"
    numaNode: 1
    computeCapability: "8.9"
    migCapable: true
    migEnabled: true
    migDevices:
      - profile: 2g.12gb
        uuid: MIG-22222222-0001-4000-8000-000000000000
        gpuInstanceId: 5
        computeInstanceId: 0
    nvlinkPeers: [0, 0]
    notSupported: [nvmlDeviceGetRemappedRows]
  - uuid: GPU-33333333-0000-4000-8000-000000000000
    name: NVIDIA H100 80GB HBM3
    memoryMiB: 81559
    pciBusId: "00000000:3C:00.0"
    computeCapability: "9.0"
    migCapable: true
    nvswitchLinks: 18
"""


def node_source(name: str, directory: Path) -> str:
    """A preset name, or for "any-node" the path of ANY_NODE written under `directory`."""
    if name != "any-node":
        return name
    path = directory / "node.yaml"
    path.write_text(ANY_NODE)
    return str(path)


def sim_root(node: str, directory: Path) -> Path:
    """`deviceplugin sim-root NODE DIR`, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "deviceplugin", "sim-root", node, str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return directory


def opened(root: Path) -> Nvml:
    nvml = real_nvml(str(root))
    nvml.init()
    return nvml


def append(root: Path, *lines: dict[str, Any]) -> None:
    with open(root / EVENTS_FILE, "a") as stream:
        for line in lines:
            stream.write(json.dumps(line) + "\n")


@pytest.fixture(scope="module")
def a100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_root("a100-80gb-x8-mixed", tmp_path_factory.mktemp("a100"))


# --- the library file ---------------------------------------------------------------------------


def test_sim_root_installs_the_library_the_node_and_the_events_file(a100: Path) -> None:
    libraries = a100 / LIBRARY_DIR
    assert (libraries / "libnvidia-ml.so").readlink() == Path("libnvidia-ml.so.1")
    assert (libraries / "libnvidia-ml.so.1").readlink() == Path("libnvidia-ml.so.550.90.07")
    assert json.loads((a100 / LIBRARY_NODE_FILE).read_text())["format"] == 1
    assert (a100 / EVENTS_FILE).exists()
    assert driver_library(str(a100)) == str((libraries / "libnvidia-ml.so.550.90.07").resolve())
    assert driver_library("/") is None


def test_every_function_nvml_h_declares_is_exported(a100: Path) -> None:
    library = ctypes.CDLL(str(a100 / LIBRARY_DIR / "libnvidia-ml.so.1"))
    names = {*declared_functions(nvml_header()), "nvmlErrorString"}
    assert len(names) > 400
    assert {"nvmlInit", "nvmlInit_v2", "nvmlDeviceGetPciInfo_v3", "nvmlEventSetWait"} <= names
    missing = sorted(name for name in names if not hasattr(library, name))
    assert missing == []


def test_unmodelled_functions_answer_not_supported(a100: Path) -> None:
    nvml = opened(a100)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    speed = ctypes.c_uint()
    assert pynvml.nvmlLib.nvmlDeviceGetFanSpeed(handle, ctypes.byref(speed)) == NOT_SUPPORTED
    nvml.shutdown()


def test_the_node_is_bare_metal_not_a_vgpu_guest(a100: Path) -> None:
    """NVIDIA's DRA driver refuses to start with DynamicMIG without this answer."""
    nvml = opened(a100)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    mode = pynvml.nvmlDeviceGetVirtualizationMode(handle)
    assert mode == pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE
    nvml.shutdown()


# --- what it reports ----------------------------------------------------------------------------


def _check_gpu(handle: Any, expected: Any, node: Node) -> None:
    n = pynvml
    assert n.nvmlDeviceGetUUID(handle) == expected.uuid
    assert n.nvmlDeviceGetName(handle) == expected.name
    assert n.nvmlDeviceGetIndex(handle) == expected.index
    assert n.nvmlDeviceGetMinorNumber(handle) == expected.minor
    assert n.nvmlDeviceGetPciInfo(handle).busId == expected.pci_bus_id.upper()
    assert n.nvmlDeviceGetMemoryInfo(handle).total == expected.memory_mib << 20
    assert n.nvmlDeviceGetCudaComputeCapability(handle) == expected.compute_capability
    if expected.numa_node is not None:
        assert n.nvmlDeviceGetNumaNodeId(handle) == expected.numa_node
    uuid_handle = n.nvmlDeviceGetHandleByUUID(expected.uuid)
    assert n.nvmlDeviceGetIndex(uuid_handle) == expected.index
    uuid_handle = n.nvmlDeviceGetHandleByUUIDV(expected.uuid, n.NVML_UUID_TYPE_ASCII)
    assert n.nvmlDeviceGetIndex(uuid_handle) == expected.index
    bus_handle = n.nvmlDeviceGetHandleByPciBusId(expected.pci_bus_id)
    assert n.nvmlDeviceGetIndex(bus_handle) == expected.index
    serial = n.nvmlDeviceGetSerial(handle)
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleBySerial(serial)) == expected.index
    links = [*(node.gpus[p].pci_bus_id for p in expected.nvlink_peers)]
    links += [switch_bus_id(i) for i in range(len(links), len(links) + expected.nvswitch_links)]
    for link, bus_id in enumerate(links):
        assert n.nvmlDeviceGetNvLinkState(handle, link) == n.NVML_FEATURE_ENABLED
        assert n.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId == bus_id.upper()


def _placement_starts(handle: Any, profile_id: int) -> list[int]:
    """nvmlDeviceGetGpuInstancePossiblePlacements_v2 as DRA drivers call it: count, then fill."""
    n, count = pynvml, ctypes.c_uint()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    placements = (n.c_nvmlGpuInstancePlacement_t * count.value)()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(
        handle, profile_id, placements, ctypes.byref(count)
    )
    return [p.start for p in placements]


def _check_migs(handle: Any, expected: Any) -> None:
    n = pynvml
    if not expected.mig_capable:
        with pytest.raises(n.NVMLError_NotSupported):
            n.nvmlDeviceGetMigMode(handle)
        return
    assert n.nvmlDeviceGetMigMode(handle) == [int(expected.mig_enabled)] * 2
    for index, mig in enumerate(expected.mig_devices):
        device = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        assert n.nvmlDeviceGetUUID(device) == mig.uuid
        assert int(n.nvmlDeviceIsMigDeviceHandle(device).value) == 1
        assert n.nvmlDeviceGetGpuInstanceId(device) == mig.gpu_instance_id
        assert n.nvmlDeviceGetComputeInstanceId(device) == mig.compute_instance_id
        attributes = n.nvmlDeviceGetAttributes(device)
        assert attributes.memorySizeMB == mig.shape.gpu_instance.memory_mib
        assert attributes.gpuInstanceSliceCount == mig.shape.gpu_instance.slices
        assert attributes.computeInstanceSliceCount == mig.shape.compute_slices
        parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device)
        assert n.nvmlDeviceGetUUID(parent) == expected.uuid
        instance = n.nvmlDeviceGetGpuInstanceById(handle, mig.gpu_instance_id)
        assert n.nvmlGpuInstanceGetInfo(instance).profileId == mig.shape.gpu_instance.id
        starts = _placement_starts(handle, mig.shape.gpu_instance.id)
        assert n.nvmlGpuInstanceGetInfo(instance).placement.start in starts
        compute = n.nvmlGpuInstanceGetComputeInstanceById(instance, mig.compute_instance_id)
        assert n.nvmlComputeInstanceGetInfo(compute).id == mig.compute_instance_id
    slots = n.nvmlDeviceGetMaxMigDeviceCount(handle)
    if expected.mig_enabled and len(expected.mig_devices) < slots:
        with pytest.raises(n.NVMLError_NotFound):
            n.nvmlDeviceGetMigDeviceHandleByIndex(handle, len(expected.mig_devices))


@pytest.mark.parametrize("preset", [*preset_names(), "any-node"])
def test_it_reports_what_the_node_file_says(preset: str, tmp_path: Path) -> None:
    source = node_source(preset, tmp_path)
    root = sim_root(source, tmp_path / "root")
    node = read_node(resolve_node_path(source))
    nvml = opened(root)
    assert pynvml.nvmlSystemGetDriverVersion() == node.driver_version
    assert pynvml.nvmlSystemGetCudaDriverVersion() == node.cuda_driver_version
    assert pynvml.nvmlDeviceGetCount() == len(node.gpus)
    for expected in node.gpus:
        handle = pynvml.nvmlDeviceGetHandleByIndex(expected.index)
        _check_gpu(handle, expected, node)
        _check_migs(handle, expected)
    nvml.shutdown()


@pytest.mark.parametrize("preset", first_quick(["any-node", *preset_names()]))
def test_inspect_and_cdi_spec_are_the_same_on_both_backends(preset: str, tmp_path: Path) -> None:
    """`inspect` and `cdi-spec` with `--simulate` (the Python simulator) and without it
    (nvidia-ml-py on the sim-root's library) say exactly the same."""
    source = node_source(preset, tmp_path)
    root = sim_root(source, tmp_path / "root")

    def run(command: str, *flags: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "deviceplugin", command, "-o", "json", *flags],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    # The dynamic-MIG node has MIG on and no MIG device: only `none` advertises its GPUs.
    strategy = "none" if preset == "a100-80gb-x8-dynamic" else "mixed"
    common = ("--nvidia-driver-root", str(root), "--mig-strategy", strategy)
    simulated = run("inspect", "--simulate", source, *common)
    assert json.loads(simulated)["resources"]
    assert run("inspect", *common) == simulated
    cdi = (*common, "--device-list-strategy", "cdi-cri")
    assert run("cdi-spec", *cdi) == run("cdi-spec", "--simulate", source, *cdi)


# --- events -------------------------------------------------------------------------------------


def test_an_appended_xid_arrives_with_the_mig_device_ids(tmp_path: Path) -> None:
    root = sim_root("a100-80gb-x8-mixed", tmp_path)
    node = read_node(resolve_node_path("a100-80gb-x8-mixed"))
    mig = node.gpus[0].mig_devices[2]
    nvml = opened(root)
    events, failed = nvml.event_set([node.gpus[0].uuid])
    assert failed == {}
    timer = threading.Timer(0.1, append, [root, {"uuid": mig.uuid, "xid": 94}])
    timer.start()
    started = time.monotonic()
    event = events.wait(5000)
    latency = time.monotonic() - started - 0.1
    timer.join()
    assert event is not None
    assert (event.gpu_uuid, event.xid) == (node.gpus[0].uuid, 94)
    assert (event.gpu_instance_id, event.compute_instance_id) == (mig.gpu_instance_id, 0)
    assert latency < 1.0
    events.close()


def test_an_idle_wait_costs_almost_no_cpu(a100: Path) -> None:
    nvml = opened(a100)
    events, _ = nvml.event_set([read_node(resolve_node_path("a100-80gb-x8-mixed")).gpus[5].uuid])
    cpu, started = time.thread_time(), time.monotonic()
    assert events.wait(2000) is None
    assert time.monotonic() - started >= 1.99
    assert time.thread_time() - cpu < 0.05
    events.close()


def test_a_lost_gpu_fails_every_later_call(tmp_path: Path) -> None:
    root = sim_root("h100-x8", tmp_path)
    uuid = read_node(resolve_node_path("h100-x8")).gpus[3].uuid
    opened(root)
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    append(root, {"uuid": uuid, "lost": True})
    for call in (
        pynvml.nvmlDeviceGetName,
        pynvml.nvmlDeviceGetUUID,
        pynvml.nvmlDeviceGetMemoryInfo,
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByUUID(uuid)
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(2)) == "NVIDIA H100 80GB HBM3"


def test_eight_threads_at_once(tmp_path: Path) -> None:
    root = sim_root("a100-80gb-x8-mixed", tmp_path)
    node = read_node(resolve_node_path("a100-80gb-x8-mixed"))
    nvml = opened(root)
    events, _ = nvml.event_set([gpu.uuid for gpu in node.gpus])
    errors: list[BaseException] = []
    received: list[int] = []

    def reader(index: int) -> None:
        try:
            for _ in range(200):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                assert pynvml.nvmlDeviceGetUUID(handle) == node.gpus[index].uuid
                for mig in range(len(node.gpus[index].mig_devices)):
                    pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig)
        except BaseException as err:  # reported below, not lost in the thread
            errors.append(err)

    def waiter() -> None:
        while len(received) < 8:
            event = events.wait(5000)
            if event is None:
                return
            received.append(event.xid)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=waiter))
    for thread in threads:
        thread.start()
    append(root, *({"uuid": gpu.uuid, "xid": 40 + gpu.index} for gpu in node.gpus))
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert sorted(received) == [40 + i for i in range(8)]
    events.close()


# --- failures -----------------------------------------------------------------------------------


def test_a_malformed_node_file_fails_init_with_a_message(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = sim_root("a10-x8", tmp_path)
    (root / LIBRARY_NODE_FILE).write_text('{"format": 1, "gpus": [{"uuid": 7}]')
    with pytest.raises(NvmlError) as caught:
        opened(root)
    assert caught.value.code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert "node file" in capfd.readouterr().err


def test_a_missing_events_file_fails_init_with_a_message(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = sim_root("a10-x8", tmp_path)
    (root / EVENTS_FILE).unlink()
    with pytest.raises(NvmlError) as caught:
        opened(root)
    assert caught.value.code == pynvml.NVML_ERROR_NOT_FOUND
    assert "events file" in capfd.readouterr().err


def test_environment_variables_point_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a10 = sim_root("a10-x8", tmp_path / "a10")
    root = sim_root("h100-x8", tmp_path / "h100")
    monkeypatch.setenv("DEVICEPLUGIN_SIM_NODE", str(a10 / LIBRARY_NODE_FILE))
    monkeypatch.setenv("DEVICEPLUGIN_SIM_EVENTS", str(a10 / EVENTS_FILE))
    opened(root)
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA A10"


def test_handles_of_each_kind_are_told_apart(a100: Path) -> None:
    """A GPU-instance handle is no device handle: NVML's calls refuse the wrong kind."""
    nvml = opened(a100)
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    instance = pynvml.nvmlDeviceGetGpuInstanceById(gpu, pynvml.nvmlDeviceGetGpuInstanceId(mig))
    as_device = ctypes.cast(instance, type(mig))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(as_device)
    as_instance = ctypes.cast(mig, type(instance))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetInfo(as_instance)
    nvml.shutdown()


def test_a_freed_event_sets_handle_is_never_a_later_sets(a100: Path) -> None:
    """Handles are addresses: a freed set's must not come back as a later set's, or a stale
    handle would wait on someone else's events instead of being refused."""
    nvml = opened(a100)

    def address(handle: Any) -> int:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)

    freed = [pynvml.nvmlEventSetCreate() for _ in range(32)]
    for handle in freed:
        pynvml.nvmlEventSetFree(handle)
    later = [pynvml.nvmlEventSetCreate() for _ in range(32)]
    assert not {address(h) for h in freed} & {address(h) for h in later}
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(freed[0], 0)
    for handle in later:
        pynvml.nvmlEventSetFree(handle)
    nvml.shutdown()


def test_a_program_finds_it_on_its_library_path_with_no_other_setting(a100: Path) -> None:
    """Plain nvidia-ml-py, loading `libnvidia-ml.so.1` by soname as it always does, finds the
    simulated node through LD_LIBRARY_PATH alone: the library locates its node itself."""
    script = (
        "import pynvml as n; n.nvmlInit(); "
        "print(n.nvmlDeviceGetCount(), n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(0)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"LD_LIBRARY_PATH": str(a100 / LIBRARY_DIR), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == ["8", "NVIDIA A100-SXM4-80GB\n"]


def test_a_packaged_library_for_another_architecture_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    foreign = tmp_path / "libnvidia-ml.so.1"
    header = bytearray(b"\x7fELF\x02\x01\x01" + bytes(13))
    header[18:20] = (183).to_bytes(2, "little")  # aarch64
    foreign.write_bytes(bytes(header) + bytes(64))
    monkeypatch.setattr(libbuild, "PACKAGED", foreign)
    monkeypatch.setattr(libbuild.platform, "machine", lambda: "x86_64")

    def no_compiler() -> Path:
        raise libbuild.BuildError("no gcc")

    monkeypatch.setattr(libbuild, "build", no_compiler)
    with pytest.raises(libbuild.BuildError, match="built for aarch64, this machine is x86_64"):
        libbuild.library_path()
