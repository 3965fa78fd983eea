"""Discovery through the real NVML seam on simulated nodes: presets, MIG naming against the
golden table, NUMA from sysfs, links, lost GPUs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from simnode import SimNode, gpu, gpu_uuid, mig_uuid, migs

from deviceplugin.model.devices import Inventory, Link, PcieLevel
from deviceplugin.model.errors import NvmlError
from deviceplugin.model.resources import mig_resource_name
from deviceplugin.node.discovery import discover, mig_profile_name, sysfs_bus_id, sysfs_numa_reader
from deviceplugin.node.nvml import Nvml
from deviceplugin.sim.fake_nvml import FakeNvml
from deviceplugin.sim.simulator import NodeSimulator

pytestmark = pytest.mark.usefixtures("nvml_backend")

GOLDEN = yaml.safe_load((Path(__file__).parent / "data" / "mig-profiles.yaml").read_text())
# GH200-144GB has no published NVML total; its names imply 146433..147456 MiB.
TOTAL_FALLBACK_MIB = {"GH200-144GB": 147456}


def _discover(preset: str) -> Inventory:
    nvml = NodeSimulator(preset).open_nvml(None)
    nvml.init()
    try:
        return discover(nvml, host_root="/nonexistent")
    finally:
        nvml.shutdown()


# --- presets ------------------------------------------------------------------------------------


def test_a100_mixed_preset() -> None:
    inventory = _discover("a100-80gb-x8-mixed")
    assert len(inventory.gpus) == 8
    assert {g.name for g in inventory.gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert [g.mig_enabled for g in inventory.gpus] == [True] * 4 + [False] * 4
    assert all(g.mig_capable and g.memory_mib == 81920 for g in inventory.gpus)
    for g in inventory.gpus[:4]:
        assert [m.profile for m in g.mig_devices] == ["1g.10gb"] * 7
        assert [m.index for m in g.mig_devices] == list(range(7))
        assert [m.gpu_instance_id for m in g.mig_devices] == [7, 8, 9, 11, 12, 13, 14]
        assert {(m.memory_mib, m.gpu_slices, m.compute_slices) for m in g.mig_devices} == {
            (9728, 1, 1)
        }
    assert all(not g.mig_devices for g in inventory.gpus[4:])
    assert [g.numa_node for g in inventory.gpus] == [0] * 4 + [1] * 4
    assert all(link.nvlinks == 12 for link in inventory.links.values())
    assert len(inventory.links) == 28
    assert inventory.link(0, 1).pcie is PcieLevel.SINGLE
    assert inventory.link(0, 2).pcie is PcieLevel.NODE
    assert inventory.link(3, 4).pcie is PcieLevel.SYSTEM
    assert inventory.driver_version == "550.90.07"
    assert inventory.cuda_driver_version == 12040


def test_a30_preset() -> None:
    inventory = _discover("a30-x4-mig")
    assert [g.name for g in inventory.gpus] == ["NVIDIA A30"] * 4
    for g in inventory.gpus:
        assert [m.profile for m in g.mig_devices] == ["1g.6gb"] * 4
    assert [g.numa_node for g in inventory.gpus] == [0, 0, 1, 1]
    assert all(link.nvlinks == 0 for link in inventory.links.values())


def test_a10_preset() -> None:
    inventory = _discover("a10-x8")
    assert [g.name for g in inventory.gpus] == ["NVIDIA A10"] * 8
    assert all(not g.mig_capable and not g.mig_enabled for g in inventory.gpus)
    assert [g.numa_node for g in inventory.gpus] == [0] * 4 + [1] * 4
    assert [g.compute_capability for g in inventory.gpus] == ["8.6"] * 8
    assert inventory.link(0, 1) == Link(nvlinks=0, pcie=PcieLevel.SINGLE)
    assert inventory.link(0, 3) == Link(nvlinks=0, pcie=PcieLevel.NODE)
    assert inventory.link(3, 4) == Link(nvlinks=0, pcie=PcieLevel.SYSTEM)


def test_h100_preset() -> None:
    inventory = _discover("h100-x8")
    assert [g.name for g in inventory.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert all(g.mig_capable and not g.mig_enabled for g in inventory.gpus)
    assert [g.minor for g in inventory.gpus] == list(range(8))
    assert {link.nvlinks for link in inventory.links.values()} == {18}
    assert len({g.uuid for g in inventory.gpus}) == 8


def test_dgx1_hybrid_cube_links() -> None:
    inventory = _discover("dgx1-hybrid-cube")
    nvlinks = [[inventory.link(a, b).nvlinks if a != b else 0 for b in range(8)] for a in range(8)]
    assert nvlinks == [
        [0, 1, 1, 2, 2, 0, 0, 0],
        [1, 0, 2, 1, 0, 2, 0, 0],
        [1, 2, 0, 2, 0, 0, 1, 0],
        [2, 1, 2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 1, 1, 2],
        [0, 2, 0, 0, 1, 0, 2, 1],
        [0, 0, 1, 0, 1, 2, 0, 2],
        [0, 0, 0, 1, 2, 1, 2, 0],
    ]
    assert inventory.link(0, 2).pcie is PcieLevel.HOSTBRIDGE
    assert inventory.link(0, 4).pcie is PcieLevel.SYSTEM


def test_preset_uuids_look_real() -> None:
    inventory = _discover("a100-80gb-x8-mixed")
    uuids = [g.uuid for g in inventory.gpus] + [
        m.uuid for g in inventory.gpus for m in g.mig_devices
    ]
    assert len(set(uuids)) == 8 + 28
    for uuid in uuids:
        kind, *groups = uuid.split("-")
        assert kind in ("GPU", "MIG")
        assert [len(group) for group in groups] == [8, 4, 4, 4, 12]
        assert groups[2][0] == "4" and groups[3][0] == "8"


# --- MIG naming ---------------------------------------------------------------------------------


def _golden_cases() -> list[Any]:
    cases = []
    for model, spec in GOLDEN["gpus"].items():
        total = spec["memory_total_mib"] or TOTAL_FALLBACK_MIB[model]
        for name in spec["nvml_names"]:
            for row in spec["profiles"]:
                if row["resource"] is None or row["mem_mib"] is None:
                    continue
                for mib in row["mem_mib"]:
                    case = (name, total, row["name"], mib, row["resource"])
                    cases.append(pytest.param(*case, id=f"{name}-{row['name']}-{mib}"))
    return cases


@pytest.mark.parametrize(
    ("gpu_name", "total_mib", "profile", "mem_mib", "resource"), _golden_cases()
)
def test_golden_table_resource_names(
    tmp_path: Path, gpu_name: str, total_mib: int, profile: str, mem_mib: int, resource: str
) -> None:
    device = {"profile": profile, "uuid": mig_uuid(0, 0), "memoryMiB": mem_mib}
    fields = {"migCapable": True, "migEnabled": True, "migDevices": [device]}
    node = SimNode(tmp_path, [gpu(0, name=gpu_name, memoryMiB=total_mib, **fields)])
    (mig,) = discover(node.nvml).gpus[0].mig_devices
    assert mig_resource_name(mig.profile) == resource
    assert mig.memory_mib == mem_mib


def _compute_instance_cases() -> list[Any]:
    cases = []
    for spec in GOLDEN["gpus"].values():
        parents = {row["name"]: row for row in spec["profiles"]}
        for row in spec.get("compute_instances", []):
            for name in spec["nvml_names"]:
                parent = parents[row["parent"]]
                case = (name, spec["memory_total_mib"], row["name"], parent["mem_mib"][0])
                cases.append(pytest.param(*case, id=f"{name}-{row['name']}"))
    return cases


@pytest.mark.parametrize(("gpu_name", "total_mib", "profile", "mem_mib"), _compute_instance_cases())
def test_golden_table_compute_instance_names(
    tmp_path: Path, gpu_name: str, total_mib: int, profile: str, mem_mib: int
) -> None:
    device = {"profile": profile, "uuid": mig_uuid(0, 0), "memoryMiB": mem_mib}
    fields = {"migCapable": True, "migEnabled": True, "migDevices": [device]}
    node = SimNode(tmp_path, [gpu(0, name=gpu_name, memoryMiB=total_mib, **fields)])
    (mig,) = discover(node.nvml).gpus[0].mig_devices
    assert mig.profile == profile
    assert mig.compute_slices < mig.gpu_slices


def test_compute_instances_share_a_gpu_instance(tmp_path: Path) -> None:
    devices = [
        {"profile": "1c.2g.20gb", "uuid": mig_uuid(0, 0), "gpuInstanceId": 5},
        {
            "profile": "1c.2g.20gb",
            "uuid": mig_uuid(0, 1),
            "gpuInstanceId": 5,
            "computeInstanceId": 1,
        },
    ]
    node = SimNode(tmp_path, [gpu(0, migCapable=True, migEnabled=True, migDevices=devices)])
    found = discover(node.nvml).gpus[0].mig_devices
    assert [(m.profile, m.gpu_instance_id, m.compute_instance_id) for m in found] == [
        ("1c.2g.20gb", 5, 0),
        ("1c.2g.20gb", 5, 1),
    ]


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        pytest.param("1g.10gb+me", "1g.10gb+me", id="rev1-media-engines"),
        pytest.param("1g.20gb", "1g.20gb", id="rev2-two-memory-slices"),
        pytest.param("7g.80gb", "7g.80gb", id="whole-gpu-instance"),
        pytest.param("3g.40gb", "3g.40gb", id="three-slices"),
    ],
)
def test_suffixes_and_variants_on_a100(tmp_path: Path, profile: str, expected: str) -> None:
    node = SimNode(tmp_path, [gpu(0, **migs(0, profile))])
    assert discover(node.nvml).gpus[0].mig_devices[0].profile == expected


@pytest.mark.parametrize(
    "profile",
    [
        "1g.12gb",
        "2g.24gb",
        "3g.36gb",
        "4g.48gb",
        "7g.96gb",
        "1g.12gb+me",
        "1g.12gb+gfx",
        "1g.12gb-me",
        "2g.24gb+me.all",
        "1c.3g.36gb",
    ],
)
def test_unknown_model_round_trips(tmp_path: Path, profile: str) -> None:
    node = SimNode(
        tmp_path, [gpu(0, name="NVIDIA Future GPU", memoryMiB=98304, **migs(0, profile))]
    )
    assert discover(node.nvml).gpus[0].mig_devices[0].profile == profile


@pytest.mark.parametrize(
    ("slices", "mib", "total_mib", "expected"),
    [
        pytest.param(3, 71168, 143771, "3g.71gb", id="h200-half-rounds-away-from-zero"),
        pytest.param(1, 22528, 183359, "1g.23gb", id="b200-half-rounds-away-from-zero"),
        pytest.param(7, 80896, 81920, "7g.80gb", id="a100-not-legacy-79gb"),
        pytest.param(1, 4864, 40536, "1g.5gb", id="a100-40gb-1g"),
    ],
)
def test_profile_name_rounding(slices: int, mib: int, total_mib: int, expected: str) -> None:
    assert mig_profile_name(slices, slices, 0x0, mib, total_mib << 20) == expected


def test_profile_name_compute_subprofile_and_suffix() -> None:
    assert mig_profile_name(2, 1, 0x1, 19968, 81920 << 20) == "1c.2g.20gb"
    assert mig_profile_name(1, 1, 0x7, 9728, 81920 << 20) == "1g.10gb+me"


# --- NUMA ---------------------------------------------------------------------------------------


def _sysfs(root: Path, bus_id: str, text: str) -> None:
    directory = root / "sys" / "bus" / "pci" / "devices" / bus_id
    directory.mkdir(parents=True)
    (directory / "numa_node").write_text(text)


def test_numa_from_sysfs_where_nvml_cannot_say(tmp_path: Path) -> None:
    _sysfs(tmp_path, "0000:10:00.0", "1\n")
    _sysfs(tmp_path, "0000:11:00.0", "-1\n")
    _sysfs(tmp_path, "0000:12:00.0", "garbage\n")
    node = SimNode(tmp_path, [gpu(i) for i in range(4)], numa=False)
    inventory = discover(node.nvml, host_root=str(tmp_path))
    assert [g.numa_node for g in inventory.gpus] == [1, None, None, None]


def test_numa_from_nvml_before_sysfs(tmp_path: Path) -> None:
    _sysfs(tmp_path, "0000:10:00.0", "1\n")
    node = SimNode(tmp_path, [gpu(0, numaNode=0), gpu(1, numaNode=2)], numa=False)
    inventory = discover(node.nvml, host_root=str(tmp_path))
    assert [g.numa_node for g in inventory.gpus] == [0, 2]


def test_numa_from_simulator_ignores_sysfs(tmp_path: Path) -> None:
    _sysfs(tmp_path, "0000:10:00.0", "1\n")
    node = SimNode(tmp_path, [gpu(0, numaNode=0), gpu(1)])
    inventory = discover(node.nvml, host_root=str(tmp_path))
    assert [g.numa_node for g in inventory.gpus] == [0, None]


def test_sysfs_bus_id() -> None:
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bus_id("00000001:07:00.0") == "0001:07:00.0"
    assert sysfs_numa_reader("/nonexistent")("00000000:3B:00.0") is None


# --- failures -----------------------------------------------------------------------------------


def test_lost_gpu_is_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = SimNode(tmp_path, [gpu(i, nvswitchLinks=12) for i in range(4)])
    node.append({"uuid": gpu_uuid(2), "lost": True})
    with caplog.at_level(logging.WARNING):
        inventory = discover(node.nvml)
    assert [g.index for g in inventory.gpus] == [0, 1, 3]
    assert set(inventory.links) == {(0, 1), (0, 3), (1, 3)}
    assert "discovery.gpu.lost" in caplog.messages
    node.append({"uuid": gpu_uuid(2), "lost": False})
    assert [g.index for g in discover(node.nvml).gpus] == [0, 1, 2, 3]


def test_other_nvml_failure_names_the_gpu(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0), gpu(1, notSupported=["nvmlDeviceGetMinorNumber"])])
    with pytest.raises(NvmlError, match="GPU 1") as caught:
        discover(node.nvml)
    assert caught.value.code == 3


def test_topology_not_supported_is_system(tmp_path: Path) -> None:
    unsupported = {"notSupported": ["nvmlDeviceGetTopologyCommonAncestor"]}
    node = SimNode(
        tmp_path, [gpu(0, pcieSwitches=["sw"], **unsupported), gpu(1, pcieSwitches=["sw"])]
    )
    assert discover(node.nvml).link(0, 1) == Link(nvlinks=0, pcie=PcieLevel.SYSTEM)


def test_pcie_levels_from_switch_tree(tmp_path: Path) -> None:
    gpus = [
        gpu(0, pcieSwitches=["root", "leafA"], hostBridge="hb0"),
        gpu(1, pcieSwitches=["root", "leafA"], hostBridge="hb0"),
        gpu(2, pcieSwitches=["root", "leafB"], hostBridge="hb0"),
        gpu(3, pcieSwitches=["other"], hostBridge="hb0"),
    ]
    inventory = discover(SimNode(tmp_path, gpus).nvml)
    assert inventory.link(0, 1).pcie is PcieLevel.SINGLE
    assert inventory.link(0, 2).pcie is PcieLevel.MULTIPLE
    assert inventory.link(0, 3).pcie is PcieLevel.HOSTBRIDGE


def test_nvlink_not_supported_means_no_links(tmp_path: Path) -> None:
    gpus = [
        gpu(0, nvlinkPeers=[1, 1], notSupported=["nvmlDeviceGetNvLinkState"]),
        gpu(1, nvlinkPeers=[0, 0]),
    ]
    assert discover(SimNode(tmp_path, gpus).nvml).link(0, 1).nvlinks == 0


def test_mig_enabled_gpu_without_mig_devices(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0, migCapable=True, migEnabled=True)])
    (found,) = discover(node.nvml).gpus
    assert found.mig_enabled and found.mig_devices == ()


def test_mig_layout_recut_is_rediscovered(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0, **migs(0, "1g.10gb", "1g.10gb"))])
    assert [m.profile for m in discover(node.nvml).gpus[0].mig_devices] == ["1g.10gb"] * 2
    node.rewrite([gpu(0, **migs(0, "3g.40gb", "4g.40gb"))])
    assert [m.profile for m in discover(node.nvml).gpus[0].mig_devices] == ["3g.40gb", "4g.40gb"]


def test_discovery_asks_plain_nvml_for_numa_nodes(tmp_path: Path) -> None:
    sim = FakeNvml("a10-x8")
    nvml = Nvml(sim)
    nvml.init()
    inventory = discover(nvml, host_root=str(tmp_path))
    assert [g.numa_node for g in inventory.gpus] == [0] * 4 + [1] * 4
