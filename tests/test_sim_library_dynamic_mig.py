"""Dynamic MIG at the simulated libnvidia-ml.so.1's ABI, through nvidia-ml-py loading it from a
`sim-root`: MIG mode, NVIDIA's placements, GPU and compute instances created and destroyed with
NVML's errors, one layout shared by every process on the root, and the capability files
following it."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as n
import pytest
from test_sim_library import _placement_starts, opened, sim_root

from deviceplugin.sim.hostroot import CAPABILITIES_DIR, MIG_STATE_FILE
from testbed.simnvml import on_library

# A100-80GB (dra-sharing.md, "MIG placements"): driver profile id -> (start, size) placements.
A100_PLACEMENTS = {
    19: [(s, 1) for s in range(7)],  # 1g.10gb
    20: [(s, 1) for s in range(7)],  # 1g.10gb+me
    15: [(0, 2), (2, 2), (4, 2), (6, 2)],  # 1g.20gb
    14: [(0, 2), (2, 2), (4, 2)],  # 2g.20gb
    9: [(0, 4), (4, 4)],  # 3g.40gb
    5: [(0, 4)],  # 4g.40gb
    0: [(0, 8)],  # 7g.80gb
}
ONE_G, TWO_G, THREE_G, FOUR_G, SEVEN_G, ONE_G_ME = 19, 14, 9, 5, 0, 20
CI_FULL = n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
EMPTY_A100 = 4  # a100-80gb-x8-mixed: GPUs 4 to 7 are whole, MIG off (Ampere)


@pytest.fixture
def a100(tmp_path: Path, fresh_sim_root: Callable[[str, Path], Path]) -> Any:
    root = fresh_sim_root("a100-80gb-x8-mixed", tmp_path / "root")
    nvml = opened(root)
    yield root
    nvml.shutdown()


def placements(handle: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    found = (n.c_nvmlGpuInstancePlacement_t * count.value)()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, found, ctypes.byref(count))
    return [(p.start, p.size) for p in found]


def placement(start: int, size: int) -> Any:
    """A placement as the C function takes it: nvidia-ml-py passes the argument on as it is."""
    place = n.c_nvmlGpuInstancePlacement_t()
    place.start, place.size = start, size
    return ctypes.pointer(place)


def emptied(index: int = 0) -> Any:
    """GPU `index` of the A100 preset with every MIG device destroyed."""
    gpu = n.nvmlDeviceGetHandleByIndex(index)
    for gi_id in {n.nvmlGpuInstanceGetInfo(gi).id for gi in gpu_instances(gpu)}:
        gi = n.nvmlDeviceGetGpuInstanceById(gpu, gi_id)
        for ci in compute_instances(gi):
            n.nvmlComputeInstanceDestroy(ci)
        n.nvmlGpuInstanceDestroy(gi)
    assert gpu_instances(gpu) == []
    return gpu


def gpu_instances(gpu: Any) -> list[Any]:
    found = []
    for profile_id in A100_PLACEMENTS:
        info = n.nvmlDeviceGetGpuInstanceProfileInfo(gpu, _enum(gpu, profile_id))
        buffer = (n.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(info.instanceCount)
        n.nvmlDeviceGetGpuInstances(gpu, profile_id, buffer, ctypes.byref(count))
        found += buffer[: count.value]
    return found


def compute_instances(gi: Any) -> list[Any]:
    buffer = (n.c_nvmlComputeInstance_t * 8)()
    count = ctypes.c_uint(8)
    found = []
    for profile in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            n.nvmlGpuInstanceGetComputeInstances(gi, profile, buffer, ctypes.byref(count))
        except n.NVMLError_NotSupported:
            continue
        found += buffer[: count.value]
    return found


def _enum(gpu: Any, profile_id: int) -> int:
    for enum in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            if n.nvmlDeviceGetGpuInstanceProfileInfo(gpu, enum).id == profile_id:
                return enum
        except n.NVMLError_NotSupported:
            continue
    raise AssertionError(f"no profile {profile_id}")


def address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def mig_uuids(gpu: Any) -> list[str]:
    uuids = []
    for index in range(n.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            uuids.append(n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)))
        except n.NVMLError_NotFound:
            continue
    return uuids


# --- placements -----------------------------------------------------------------------------


def test_placements_are_nvidias_for_each_a100_profile(a100: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(EMPTY_A100)
    assert {p: placements(gpu, p) for p in A100_PLACEMENTS} == A100_PLACEMENTS
    assert _placement_starts(gpu, THREE_G) == [0, 4]
    assert n.nvmlDeviceGetGpuInstanceProfileInfo(gpu, _enum(gpu, ONE_G_ME)).instanceCount == 1
    assert n.nvmlDeviceGetGpuInstanceProfileInfo(gpu, _enum(gpu, 15)).instanceCount == 4


@pytest.mark.parametrize(
    ("preset", "index", "expected"),
    [
        ("h100-x8", 0, {19: [(s, 1) for s in range(7)], 9: [(0, 4), (4, 4)], 0: [(0, 8)]}),
        ("a30-x4-mig", 0, {14: [(s, 1) for s in range(4)], 5: [(0, 2), (2, 2)], 0: [(0, 4)]}),
    ],
)
def test_placements_of_the_other_models(
    preset: str, index: int, expected: dict[int, list[tuple[int, int]]], tmp_path: Path
) -> None:
    nvml = opened(sim_root(preset, tmp_path))
    gpu = n.nvmlDeviceGetHandleByIndex(index)
    assert {p: placements(gpu, p) for p in expected} == expected
    nvml.shutdown()


# --- creating and destroying ----------------------------------------------------------------


def test_a_mig_device_is_created_and_destroyed(a100: Path) -> None:
    gpu = emptied()
    gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, THREE_G, placement(4, 4))
    info = n.nvmlGpuInstanceGetInfo(gi)
    assert (info.profileId, info.placement.start, info.placement.size) == (THREE_G, 4, 4)
    assert address(n.nvmlDeviceGetGpuInstanceById(gpu, info.id)) == address(gi)
    assert mig_uuids(gpu) == []  # no compute instance yet: no MIG device
    ci = n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    ci_info = n.nvmlComputeInstanceGetInfo(ci)
    assert address(ci_info.gpuInstance) == address(gi)
    [uuid] = mig_uuids(gpu)
    mig = n.nvmlDeviceGetHandleByUUID(uuid)
    assert uuid.startswith("MIG-")
    assert n.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert n.nvmlDeviceGetGpuInstanceId(mig) == info.id
    assert n.nvmlDeviceGetComputeInstanceId(mig) == ci_info.id
    assert n.nvmlDeviceGetAttributes(mig).memorySizeMB == 40192
    assert n.nvmlDeviceGetMemoryInfo(mig).total == 40192 << 20
    with pytest.raises(n.NVMLError_InUse):
        n.nvmlGpuInstanceDestroy(gi)
    n.nvmlComputeInstanceDestroy(ci)
    assert mig_uuids(gpu) == []
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetHandleByUUID(uuid)
    n.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetGpuInstanceById(gpu, info.id)


def test_compute_instances_share_their_gpu_instance(a100: Path) -> None:
    gpu = emptied()
    gi = n.nvmlDeviceCreateGpuInstance(gpu, THREE_G)
    two = n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    names = {n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByUUID(u)) for u in mig_uuids(gpu)}
    assert names == {f"NVIDIA A100-SXM4-80GB MIG {p}" for p in ("2c.3g.40gb", "1c.3g.40gb")}
    with pytest.raises(n.NVMLError_NotSupported):  # more slices than the GPU instance has
        n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE)
    n.nvmlComputeInstanceDestroy(two)
    assert len(mig_uuids(gpu)) == 1


def test_seven_1g_fill_an_a100_and_an_eighth_is_refused(a100: Path) -> None:
    gpu = emptied()
    starts = []
    for _ in range(7):
        gi = n.nvmlDeviceCreateGpuInstance(gpu, ONE_G)
        starts.append(n.nvmlGpuInstanceGetInfo(gi).placement.start)
        n.nvmlGpuInstanceCreateComputeInstance(gi, CI_FULL)
    assert sorted(starts) == list(range(7))
    assert len(set(mig_uuids(gpu))) == 7
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlDeviceCreateGpuInstance(gpu, ONE_G)
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, ONE_G, placement(3, 1))


def test_3g_3g_then_1g_is_refused_but_4g_3g_fit(a100: Path) -> None:
    gpu = emptied()
    first = n.nvmlDeviceCreateGpuInstance(gpu, THREE_G)
    n.nvmlDeviceCreateGpuInstance(gpu, THREE_G)
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlDeviceCreateGpuInstance(gpu, ONE_G)  # the two 3g hold all 8 memory slices
    n.nvmlGpuInstanceDestroy(first)
    n.nvmlDeviceCreateGpuInstance(gpu, FOUR_G)  # at 0, beside the 3g at 4
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlDeviceCreateGpuInstance(gpu, SEVEN_G)


def test_overlapping_placements_and_a_second_media_instance_are_refused(a100: Path) -> None:
    gpu = emptied()
    n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, TWO_G, placement(2, 2))
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, ONE_G, placement(3, 1))
    with pytest.raises(n.NVMLError_InvalidArgument):  # not a placement of the profile
        n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, TWO_G, placement(1, 2))
    n.nvmlDeviceCreateGpuInstance(gpu, ONE_G_ME)
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlDeviceCreateGpuInstance(gpu, ONE_G_ME)


def test_profiles_the_gpu_lacks_and_mig_off_are_refused(a100: Path) -> None:
    gpu = emptied()
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceCreateGpuInstance(gpu, 77)
    gi = n.nvmlDeviceCreateGpuInstance(gpu, ONE_G)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
    off = n.nvmlDeviceGetHandleByIndex(EMPTY_A100)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceCreateGpuInstance(off, ONE_G)


# --- MIG mode -------------------------------------------------------------------------------


def test_ampere_mig_mode_is_pending_until_reset(a100: Path) -> None:
    gpu = n.nvmlDeviceGetHandleByIndex(EMPTY_A100)
    assert n.nvmlDeviceSetMigMode(gpu, n.NVML_DEVICE_MIG_ENABLE) == n.NVML_ERROR_RESET_REQUIRED
    assert n.nvmlDeviceGetMigMode(gpu) == [0, 1]
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceCreateGpuInstance(gpu, ONE_G)
    assert n.nvmlDeviceSetMigMode(gpu, n.NVML_DEVICE_MIG_DISABLE) == n.NVML_SUCCESS
    assert n.nvmlDeviceGetMigMode(gpu) == [0, 0]
    busy = n.nvmlDeviceGetHandleByIndex(0)  # holds GPU instances
    assert n.nvmlDeviceSetMigMode(busy, n.NVML_DEVICE_MIG_DISABLE) == n.NVML_ERROR_IN_USE
    assert n.nvmlDeviceGetMigMode(busy) == [1, 1]


def test_hopper_mig_mode_changes_at_once(tmp_path: Path) -> None:
    nvml = opened(sim_root("h100-x8", tmp_path))
    gpu = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetMigMode(gpu) == [0, 0]
    assert n.nvmlDeviceSetMigMode(gpu, n.NVML_DEVICE_MIG_ENABLE) == n.NVML_SUCCESS
    assert n.nvmlDeviceGetMigMode(gpu) == [1, 1]
    gi = n.nvmlDeviceCreateGpuInstance(gpu, SEVEN_G)
    n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE)
    [uuid] = mig_uuids(gpu)
    assert n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByUUID(uuid)).endswith("MIG 7g.80gb")
    nvml.shutdown()


# --- shared by processes, and on the host's files -------------------------------------------


def test_another_process_sees_and_changes_the_same_instances(a100: Path) -> None:
    gpu = emptied()
    gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, TWO_G, placement(4, 2))
    n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    [ours] = mig_uuids(gpu)
    theirs, start = on_library(
        a100,
        "print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)))",
        f"gi = n.nvmlDeviceCreateGpuInstance(gpu, {ONE_G})",
        "n.nvmlGpuInstanceCreateComputeInstance(gi, 0)",
        "print(n.nvmlGpuInstanceGetInfo(gi).placement.start)",
    ).split()
    assert theirs == ours
    assert start == "0"
    assert len(mig_uuids(gpu)) == 2  # theirs, seen here
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, ONE_G, placement(0, 1))
    assert (a100 / MIG_STATE_FILE).is_file()


def test_capability_files_follow_the_instances(a100: Path) -> None:
    caps = a100 / CAPABILITIES_DIR / "gpu0" / "mig"
    assert (caps / "gi7" / "ci0" / "access").is_file()  # the preset's own
    gpu = emptied()
    assert not list(caps.glob("gi*/access"))
    gi = n.nvmlDeviceCreateGpuInstance(gpu, THREE_G)
    gi_id = n.nvmlGpuInstanceGetInfo(gi).id
    assert (
        (caps / f"gi{gi_id}" / "access")
        .read_text()
        .startswith(f"DeviceFileMinor: {3 + 9 * gi_id}\n")
    )
    ci = n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    ci_id = n.nvmlComputeInstanceGetInfo(ci).id
    ci_file = caps / f"gi{gi_id}" / f"ci{ci_id}" / "access"
    assert ci_file.read_text().startswith(f"DeviceFileMinor: {3 + 9 * gi_id + 1 + ci_id}\n")
    n.nvmlComputeInstanceDestroy(ci)
    assert not ci_file.exists()
    n.nvmlGpuInstanceDestroy(gi)
    assert not (caps / f"gi{gi_id}").exists()


def test_a_change_writes_only_the_capability_files_it_changes(a100: Path) -> None:
    """Every other instance's access file is left as it was (same inode, same mtime): a commit
    costs in proportion to what changed, not to every id the driver's table allows."""
    caps = a100 / CAPABILITIES_DIR
    before = {p: p.stat() for p in caps.glob("gpu*/mig/**/access")}
    assert len(before) == 2 * 28  # the preset's 28 MIG devices: a GPU and a compute instance each
    gpu = emptied(1)
    gone = {p for p in before if p.is_relative_to(caps / "gpu1")}
    gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, THREE_G, placement(4, 4))
    n.nvmlGpuInstanceCreateComputeInstance(gi, CI_FULL)
    for path, seen in before.items():
        if path in gone:
            continue
        now = path.stat()
        assert (now.st_ino, now.st_mtime_ns) == (seen.st_ino, seen.st_mtime_ns), path
    made = set(caps.glob("gpu1/mig/**/access"))
    assert len(made) == 2  # the new GPU and compute instance


def test_sim_root_again_brings_back_the_nodes_layout(tmp_path: Path) -> None:
    """Another process changes the layout (this one keeps no copy of the library loaded, which
    sim-root replaces); sim-root again forgets the change."""
    root = sim_root("a100-80gb-x8-mixed", tmp_path)
    gi7 = root / CAPABILITIES_DIR / "gpu0" / "mig" / "gi7"
    on_library(
        root,
        "gi = n.nvmlDeviceGetGpuInstanceById(gpu, 7)",
        "n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, 0))",
        "n.nvmlGpuInstanceDestroy(gi)",
    )
    assert (root / MIG_STATE_FILE).is_file()
    assert not gi7.exists()
    sim_root("a100-80gb-x8-mixed", root)
    assert not (root / MIG_STATE_FILE).exists()
    assert (gi7 / "ci0" / "access").is_file()
    found = on_library(root, "print(n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 6) and 7)")
    assert found == "7\n"
