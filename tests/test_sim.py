"""The simulator: the same API as pynvml, node files and presets, live reload, event lines."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pynvml
import pytest
from simnode import SimNode, gpu, gpu_uuid, mig_uuid, migs, write_node

from deviceplugin.model.errors import ConfigError
from deviceplugin.node.discovery import discover
from deviceplugin.node.nvml_api import NvmlModule
from deviceplugin.sim import structs
from deviceplugin.sim.events import SimEvent, parse_line
from deviceplugin.sim.fake_nvml import FakeNvml
from deviceplugin.sim.node import preset_names, read_node, read_node_once
from deviceplugin.sim.profiles import plausible_memory_mib, resolve

REQUIRED_PRESETS = ["a100-80gb-x8-mixed", "a10-x8", "a30-x4-mig", "h100-x8"]


# --- same API as pynvml -------------------------------------------------------------------------


def test_every_nvml_call_exists_in_pynvml() -> None:
    calls = [name for name in dir(FakeNvml) if name.startswith("nvml")]
    assert len(calls) > 40
    assert [name for name in calls if not hasattr(pynvml, name)] == []


def test_the_protocol_is_pynvml_and_the_simulator() -> None:
    for name in NvmlModule.__dict__:
        if name.startswith(("nvml", "NVMLError")):
            assert hasattr(pynvml, name), name
            assert hasattr(FakeNvml, name), name


def test_constants_match_pynvml() -> None:
    names = [name for name in dir(structs) if name.startswith(("NVML_", "nvmlEventType"))]
    assert len(names) > 50
    assert {name: getattr(structs, name) for name in names} == {
        name: getattr(pynvml, name) for name in names
    }


def test_error_classes_match_pynvml() -> None:
    ours = {name for name in dir(structs) if name.startswith("NVMLError_")}
    theirs = {name for name in dir(pynvml) if name.startswith("NVMLError_")}
    assert ours == theirs
    for name in ours:
        assert getattr(structs, name)().value == getattr(pynvml, name)(0).value, name


def test_error_from_code_picks_the_subclass(tmp_path: Path) -> None:
    sim = SimNode(tmp_path, [gpu(0)]).sim
    error = sim.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert isinstance(error, sim.NVMLError_GpuIsLost)
    assert error.value == 15
    assert str(error) == str(pynvml.NVMLError(15))
    assert sim.NVMLError(12345).value == 12345


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (structs.PciInfo, pynvml.nvmlPciInfo_t),
        (structs.Memory, pynvml.c_nvmlMemory_t),
        (structs.DeviceAttributes, pynvml.c_nvmlDeviceAttributes),
        (structs.GpuInstanceProfileInfo, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t),
        (structs.GpuInstanceInfo, pynvml.c_nvmlGpuInstanceInfo_t),
        (structs.ComputeInstanceProfileInfo, pynvml.c_nvmlComputeInstanceProfileInfo_v2_t),
        (structs.ComputeInstanceInfo, pynvml.c_nvmlComputeInstanceInfo_t),
        (structs.EventData, pynvml.c_nvmlEventData_t),
        (structs.FieldValue, pynvml.c_nvmlFieldValue_t),
        (structs.Value, pynvml.c_nvmlValue_t),
    ],
)
def test_struct_fields_exist_in_pynvml(ours: type, theirs: Any) -> None:
    their_fields = {name for name, *_ in theirs._fields_}
    assert set(ours.__dataclass_fields__) <= their_fields


def test_calls_need_init(tmp_path: Path) -> None:
    sim = FakeNvml(str(write_node(tmp_path / "n.yaml", [gpu(0)])))
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    sim.nvmlInit()
    sim.nvmlShutdown()
    assert sim.nvmlDeviceGetCount() == 1
    sim.nvmlShutdown()
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlShutdown()


def test_handles_by_uuid_and_mig_navigation(tmp_path: Path) -> None:
    sim = SimNode(tmp_path, [gpu(0, **migs(0, "3g.40gb", "4g.40gb"))]).sim
    parent = sim.nvmlDeviceGetHandleByUUID(gpu_uuid(0))
    mig = sim.nvmlDeviceGetHandleByUUID(mig_uuid(0, 1))
    assert sim.nvmlDeviceIsMigDeviceHandle(mig) == 1
    assert sim.nvmlDeviceIsMigDeviceHandle(parent) == 0
    assert sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) == parent
    assert sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1) == mig
    with pytest.raises(sim.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, 5)
    with pytest.raises(sim.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByUUID(gpu_uuid(3))
    assert sim.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 4g.40gb"
    assert sim.nvmlDeviceGetMemoryInfo(mig).total == 40192 << 20
    attributes = sim.nvmlDeviceGetAttributes(mig)
    assert (attributes.gpuInstanceSliceCount, attributes.memorySizeMB) == (4, 40192)
    with pytest.raises(sim.NVMLError_NotSupported):
        sim.nvmlDeviceGetAttributes(parent)
    assert sim.nvmlDeviceGetPciInfo(parent).busId == b"00000000:10:00.0"


def test_whole_gpu_has_no_mig_calls(tmp_path: Path) -> None:
    sim = SimNode(tmp_path, [gpu(0, name="NVIDIA A10", memoryMiB=23028)]).sim
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(sim.NVMLError_NotSupported):
        sim.nvmlDeviceGetMigMode(handle)
    with pytest.raises(sim.NVMLError_NotSupported):
        sim.nvmlDeviceGetNvLinkState(handle, 0)


# --- node files and presets ---------------------------------------------------------------------


def test_required_presets_exist() -> None:
    assert set(REQUIRED_PRESETS) <= set(preset_names())


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_is_valid(preset: str) -> None:
    node = read_node(
        Path(__file__).parents[1] / "deviceplugin" / "sim" / "presets" / f"{preset}.yaml"
    )
    assert node.gpus
    assert [g.index for g in node.gpus] == list(range(len(node.gpus)))


@pytest.mark.parametrize(
    ("entry", "path"),
    [
        pytest.param({"uuid": "gpu-1"}, "gpus[0].uuid", id="uuid-prefix"),
        pytest.param({"memoryMiB": None}, "gpus[0].memoryMiB", id="memory-missing"),
        pytest.param({"index": 4}, "gpus[0].index", id="index-out-of-range"),
        pytest.param({"nvlinkPeers": [0]}, "gpus[0].nvlinkPeers[0]", id="link-to-itself"),
        pytest.param({"numaNode": "zero"}, "gpus[0].numaNode", id="numa-type"),
        pytest.param({"pciBusId": "07:00"}, "gpus[0].pciBusId", id="bus-id"),
        pytest.param({"computeCapability": "eight"}, "gpus[0].computeCapability", id="cc"),
        pytest.param({"migEnabled": True, "migCapable": False}, "gpus[0].migEnabled", id="mig"),
        pytest.param(
            {"migDevices": [{"profile": "1g.10gb", "uuid": mig_uuid(0, 0)}]},
            "gpus[0].migDevices",
            id="mig-devices-without-mig",
        ),
        pytest.param(migs(0, "1g.10gbb"), "gpus[0].migDevices[0].profile", id="profile-syntax"),
        pytest.param(
            migs(0, "3c.2g.20gb"), "gpus[0].migDevices[0].profile", id="more-compute-than-gpu"
        ),
        pytest.param({"notSupported": ["nvmlDeviceGetFoo"]}, "gpus[0].notSupported", id="call"),
    ],
)
def test_invalid_node_names_the_field(tmp_path: Path, entry: dict[str, Any], path: str) -> None:
    node = write_node(tmp_path / "node.yaml", [gpu(0, **entry)])
    with pytest.raises(ConfigError) as caught:
        FakeNvml(str(node))
    assert caught.value.path == path


def test_duplicate_uuid_is_refused(tmp_path: Path) -> None:
    node = write_node(tmp_path / "node.yaml", [gpu(0), gpu(1, uuid=gpu_uuid(0))])
    with pytest.raises(ConfigError, match="more than once"):
        FakeNvml(str(node))


def test_unknown_source_lists_presets() -> None:
    with pytest.raises(ConfigError, match="h100-x8") as caught:
        FakeNvml("nope")
    assert caught.value.path == "simulate"


def test_node_file_is_reloaded_when_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = SimNode(tmp_path, [gpu(0), gpu(1)])
    assert len(discover(node.nvml).gpus) == 2
    node.rewrite([gpu(0), gpu(1), gpu(2)])
    assert len(discover(node.nvml).gpus) == 3
    node.node_path.write_text("gpus: [{uuid: nope}]\n")
    with caplog.at_level(logging.WARNING):
        assert len(discover(node.nvml).gpus) == 3
    assert "sim.node.invalid" in caplog.messages
    with pytest.raises(ConfigError):
        node.sim.reload()


def test_lost_state_survives_reload(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0), gpu(1)])
    node.append({"uuid": gpu_uuid(1), "lost": True})
    node.rewrite([gpu(0, numaNode=1), gpu(1)])
    assert [g.index for g in discover(node.nvml).gpus] == [0]


def test_numa_node_of_bus_id(tmp_path: Path) -> None:
    sim = SimNode(tmp_path, [gpu(0, numaNode=3), gpu(1)]).sim
    assert sim.numa_node("00000000:10:00.0") == 3
    assert sim.numa_node("00000000:11:00.0") is None
    assert sim.numa_node("00000000:99:00.0") is None


# --- profiles -----------------------------------------------------------------------------------


def test_known_model_uses_the_published_table() -> None:
    shape = resolve("NVIDIA A100-SXM4-80GB", 81920, "1g.10gb+me", None)
    assert (shape.gpu_instance.enum, shape.gpu_instance.id) == (0x7, 20)
    assert (shape.gpu_instance.memory_mib, shape.gpu_instance.ofas) == (9728, 1)


def test_unknown_model_gets_a_plausible_size() -> None:
    assert plausible_memory_mib(98304, 12) == 12288
    assert plausible_memory_mib(183359, 90) == 91648
    shape = resolve("NVIDIA Future GPU", 98304, "1c.3g.36gb", None)
    assert (shape.gpu_instance.slices, shape.compute_slices) == (3, 1)


@pytest.mark.parametrize("profile", ["1g", "0g.5gb", "5g.40gb", "3g.40gb+me", "1c.1g.5gb-x"])
def test_not_a_profile(profile: str) -> None:
    with pytest.raises(ValueError):
        resolve("NVIDIA A100-SXM4-80GB", 81920, profile, None)


# --- event lines --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "event"),
    [
        ('{"uuid": "GPU-1", "xid": 79}', SimEvent(uuid="GPU-1", xid=79)),
        ('{"uuid": "MIG-1", "xid": 94}', SimEvent(uuid="MIG-1", xid=94)),
        ('{"uuid": "GPU-1", "lost": true}', SimEvent(uuid="GPU-1", lost=True)),
        ('{"uuid": "GPU-1", "ecc": "single"}', SimEvent(uuid="GPU-1", ecc_type=1)),
        ('{"uuid": "GPU-1", "recoveryAction": 2}', SimEvent(uuid="GPU-1", recovery_action=2)),
        ('{"waitError": "unknown"}', SimEvent(wait_error=999)),
        ('{"waitError": "GPU_IS_LOST"}', SimEvent(wait_error=15)),
        ('{"waitError": "NVMLError_Timeout"}', SimEvent(wait_error=10)),
    ],
)
def test_event_lines(line: str, event: SimEvent) -> None:
    assert parse_line(line) == event


@pytest.mark.parametrize(
    "line",
    [
        "{",
        '"xid"',
        "{}",
        '{"uuid": "GPU-1"}',
        '{"uuid": "gpu-1", "xid": 1}',
        '{"uuid": "GPU-1", "xid": -1}',
        '{"uuid": "GPU-1", "xid": true}',
        '{"uuid": "GPU-1", "lost": "yes"}',
        '{"uuid": "GPU-1", "ecc": "triple"}',
        '{"uuid": "GPU-1", "xid": 1, "extra": 2}',
        '{"xid": 79}',
        '{"waitError": "sometimes"}',
    ],
)
def test_malformed_event_lines(line: str) -> None:
    with pytest.raises(ValueError):
        parse_line(line)


def test_a_node_file_read_again_unchanged_is_not_parsed_again(tmp_path: Path) -> None:
    """serve reads its node for the host files and again for the simulated NVML: the second
    read reuses the first while the file is unchanged, and reads a rewritten file anew."""
    path = write_node(tmp_path / "node.yaml", [gpu(0)])
    first = read_node_once(path)
    assert read_node_once(path) is first
    assert FakeNvml(str(path))._world.node is first
    write_node(path, [gpu(0), gpu(1)])
    again = read_node_once(path)
    assert again is not first and len(again.gpus) == 2
    assert FakeNvml(str(path))._world.node is again
