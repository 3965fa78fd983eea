"""model.slices: the devices and ResourceSlices `dra serve` publishes: the hardware as it is,
checked against the v1 schema, NVIDIA's attribute names and types, the seed's attributes,
topology, the unhealthy taint and the limits."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugin.explain.selectors import parse_quantity
from deviceplugin.model.slices import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    TAINT_EFFECTS,
    architecture,
    build_devices,
    build_slices,
    label_value,
    physical_devices,
    quantity,
    semver,
    split,
)
from tests.dranode import big_node, inventory
from tests.simnode import gpu as simgpu
from tests.simnode import migs, write_node

PRESETS = ("a100-80gb-x8-mixed", "a30-x4-mig", "a10-x8", "h100-x8", "dgx1-hybrid-cube")
SCHEMA_VERSIONS = ("1.34", "1.35", "1.36", "1.37")


def kinds(devices: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    return Counter(
        (d["attributes"]["type"]["string"], d["attributes"]["nvidia.com/migProfile"]["string"])
        for d in devices
    )


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("a100-80gb-x8-mixed", {("mig", "1g.10gb"): 28, ("gpu", ""): 4}),
        ("a30-x4-mig", {("mig", "1g.6gb"): 16}),
        ("a10-x8", {("gpu", ""): 8}),
        ("h100-x8", {("gpu", ""): 8}),
        ("dgx1-hybrid-cube", {("gpu", ""): 8}),
    ],
)
def test_the_hardware_decides_what_is_published(
    preset: str, expected: dict[tuple[str, str], int]
) -> None:
    """MIG-disabled GPUs whole, MIG-enabled GPUs as their MIG devices: no MIG strategy."""
    found = inventory(preset)
    assert kinds(build_devices(found)) == expected
    mig_enabled = {g.uuid for g in found.gpus if g.mig_enabled}
    for gpu, mig in physical_devices(found):
        assert (mig is not None) == (gpu.uuid in mig_enabled)


def test_a_mig_enabled_gpu_without_mig_devices_publishes_nothing(tmp_path: Path) -> None:
    """It cannot run work whole, and has no MIG device to run it on."""
    node = write_node(
        tmp_path / "node.yaml",
        [simgpu(0), simgpu(1, migCapable=True, migEnabled=True), simgpu(2, **migs(2, "1g.10gb"))],
    )
    names = [d["name"] for d in build_devices(inventory(str(node)))]
    assert names == ["gpu-0", "gpu-2-mig-1-0"]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("taint", [*TAINT_EFFECTS, None])
def test_every_slice_is_valid_under_the_v1_schema(preset: str, taint: Any) -> None:
    found = inventory(preset)
    sick = {found.gpus[0].uuid: "xid-79: GPU reset required"}
    devices = build_devices(found, sick, taint=taint)
    for item in build_slices("node-1", devices, 3):
        for version in SCHEMA_VERSIONS:
            assert kubernetes_validate.validate(item, version, strict=True) == version
        for device in item["spec"]["devices"]:
            counted = len(device["attributes"]) + len(device["capacity"])
            assert counted <= MAX_ATTRIBUTES_AND_CAPACITIES


def test_a_mig_device_carries_nvidias_attributes_and_the_seeds() -> None:
    found = inventory("a100-80gb-x8-mixed")
    gpu = found.gpus[0]
    mig = gpu.mig_devices[0]
    device = build_devices(found)[0]
    assert device["name"] == f"gpu-{gpu.minor}-mig-{mig.gpu_instance_id}-0"
    assert device["attributes"] == {
        "type": {"string": "mig"},
        "uuid": {"string": mig.uuid},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": "1g.10gb"},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "architecture": {"string": "Ampere"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "550.90.7"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "index": {"int": mig.index},
        "parentIndex": {"int": 0},
        "pcieBusID": {"string": "0000:07:00.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "nvidia.com/migProfile": {"string": "1g.10gb"},
        "nvidia.com/parentUUID": {"string": gpu.uuid},
        "nvidia.com/healthy": {"bool": True},
        "nvidia.com/numaNode": {"int": 0},
        "nvidia.com/pcieRoot": {"int": 0},
        "nvidia.com/nvlinkIsland": {"int": 0},
    }
    assert device["capacity"] == {"memory": {"value": f"{mig.memory_mib}Mi"}}
    assert "taints" not in device


def test_a_whole_gpu_carries_index_minor_and_its_own_uuid_as_parent() -> None:
    found = inventory("h100-x8")
    gpu = found.gpus[3]
    device = build_devices(found)[3]
    attributes = device["attributes"]
    assert device["name"] == f"gpu-{gpu.minor}"
    assert attributes["type"] == {"string": "gpu"}
    assert attributes["index"] == {"int": 3}
    assert attributes["minor"] == {"int": gpu.minor}
    assert attributes["architecture"] == {"string": "Hopper"}
    assert attributes["nvidia.com/parentUUID"] == {"string": gpu.uuid}
    assert attributes["nvidia.com/migProfile"] == {"string": ""}
    assert "parentUUID" not in attributes and "profile" not in attributes
    assert device["capacity"]["memory"]["value"] == quantity(gpu.memory_mib << 20)


def test_health_marks_every_device_of_a_failed_gpu_and_taints_it() -> None:
    found = inventory("a100-80gb-x8-mixed")
    failed = found.gpus[1]
    devices = build_devices(found, {failed.uuid: "xid-79"})
    by_health = Counter(
        (
            d["attributes"]["nvidia.com/parentUUID"]["string"] == failed.uuid,
            d["attributes"]["nvidia.com/healthy"]["bool"],
        )
        for d in devices
    )
    assert by_health == {(True, False): 7, (False, True): 25}
    tainted = [d for d in devices if "taints" in d]
    assert len(tainted) == 7
    assert tainted[0]["taints"] == [
        {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ]


def test_an_xid_on_one_mig_device_marks_that_device_only() -> None:
    found = inventory("a100-80gb-x8-mixed")
    mig = found.gpus[0].mig_devices[2]
    devices = build_devices(found, {mig.uuid: "xid-94"})
    sick = [
        d["attributes"]["uuid"]["string"]
        for d in devices
        if not d["attributes"]["nvidia.com/healthy"]["bool"]
    ]
    assert sick == [mig.uuid]


@pytest.mark.parametrize("effect", TAINT_EFFECTS)
def test_the_taint_effect_is_a_choice_and_the_taint_can_be_left_off(effect: Any) -> None:
    found = inventory("h100-x8")
    sick = {found.gpus[2].uuid: "gpu-lost"}
    (tainted,) = [d for d in build_devices(found, sick, taint=effect) if "taints" in d]
    assert tainted["name"] == "gpu-2"
    assert tainted["taints"] == [
        {"key": "gpu.nvidia.com/unhealthy", "value": "gpu-lost", "effect": effect}
    ]
    untainted = build_devices(found, sick, taint=None)
    assert not any("taints" in d for d in untainted)
    assert [d["attributes"]["nvidia.com/healthy"]["bool"] for d in untainted].count(False) == 1
    slices = build_slices("n", untainted, 1)
    kubernetes_validate.validate(slices[0], "1.37", strict=True)


@pytest.mark.parametrize(
    ("preset", "islands", "roots"),
    [
        ("a100-80gb-x8-mixed", {0}, {0, 2, 4, 6}),  # NVSwitch; a PCIe switch per pair
        ("h100-x8", {0}, set(range(8))),
        ("a10-x8", set(range(8)), {0, 2, 4, 6}),  # no NVLink
        ("dgx1-hybrid-cube", {0}, {0, 4}),  # the cube joins all eight
    ],
)
def test_topology_groups(preset: str, islands: set[int], roots: set[int]) -> None:
    found = inventory(preset)
    devices = build_devices(found)  # a MIG device carries its GPU's values
    assert {d["attributes"]["nvidia.com/nvlinkIsland"]["int"] for d in devices} == islands
    assert {d["attributes"]["nvidia.com/pcieRoot"]["int"] for d in devices} == roots


def test_a_64_gpu_node_splits_at_the_per_slice_limit(tmp_path: Path) -> None:
    found = inventory(str(big_node(tmp_path / "node.yaml")))
    devices = build_devices(found)
    slices = build_slices("big", devices, 1)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 128, 64]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {4}
    assert [s["metadata"]["name"] for s in slices] == [f"big-gpu.nvidia.com-{n}" for n in range(4)]
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert len(set(names)) == len(names) == 448
    for item in slices:
        kubernetes_validate.validate(item, "1.34", strict=True)


def test_a_slice_with_a_tainted_device_holds_at_most_64(tmp_path: Path) -> None:
    found = inventory(str(big_node(tmp_path / "node.yaml")))
    sick = {found.gpus[10].uuid: "xid-79"}  # devices 70..76
    slices = build_slices("big", build_devices(found, sick), 1)
    sizes = [len(s["spec"]["devices"]) for s in slices]
    assert sizes == [70, 64, 128, 128, 58]  # a new slice where the first tainted device comes
    for item in slices:
        tainted = any("taints" in d for d in item["spec"]["devices"])
        assert len(item["spec"]["devices"]) <= (64 if tainted else 128)


def test_an_empty_node_publishes_one_empty_slice() -> None:
    (only,) = build_slices("n", [], 1)
    assert only["spec"]["devices"] == []
    assert only["spec"]["pool"] == {"name": "n", "generation": 1, "resourceSliceCount": 1}
    kubernetes_validate.validate(only, "1.34", strict=True)


@pytest.mark.parametrize(
    ("count", "text"),
    [(80 << 30, "80Gi"), (9856 << 20, "9856Mi"), (1536, "1536"), (1024, "1Ki"), (0, "0"), (7, "7")],
)
def test_quantity_is_canonical_binary(count: int, text: str) -> None:
    assert quantity(count) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [("550.90.07", "550.90.7"), ("8.0", "8.0.0"), ("12", "12.0.0"), ("r550", None), ("", None)],
)
def test_semver_is_normalised_as_nvidia_does(text: str, expected: str | None) -> None:
    assert semver(text) == expected


@pytest.mark.parametrize(
    ("capability", "name"),
    [
        ("7.0", "Volta"),
        ("7.5", "Turing"),
        ("8.0", "Ampere"),
        ("8.6", "Ampere"),
        ("8.9", "Ada Lovelace"),
        ("9.0", "Hopper"),
        ("10.0", "Blackwell"),
        ("", "Unknown"),
    ],
)
def test_architecture_from_compute_capability(capability: str, name: str) -> None:
    assert architecture(capability) == name


@pytest.mark.parametrize(
    ("reason", "value"),
    [
        ("xid-79", "xid-79"),
        ("xid-79: GPU reset", "xid-79-GPU-reset"),
        ("x" * 80, "x" * 63),
        ("", ""),
    ],
)
def test_taint_values_are_label_values(reason: str, value: str) -> None:
    assert label_value(reason) == value


@given(st.lists(st.booleans(), max_size=700))
def test_split_keeps_order_and_every_slice_within_its_limit(tainted: list[bool]) -> None:
    devices = [
        {"name": f"d-{n}", **({"taints": [{"key": "k", "effect": "NoSchedule"}]} if t else {})}
        for n, t in enumerate(tainted)
    ]
    chunks = split(devices)
    assert [d for chunk in chunks for d in chunk] == devices
    assert all(chunks) or chunks == [[]]
    for chunk in chunks:
        assert len(chunk) <= (64 if any("taints" in d for d in chunk) else 128)


@given(st.integers(min_value=0, max_value=1 << 62))
def test_quantity_reads_back_as_the_same_count(count: int) -> None:
    assert parse_quantity(quantity(count)) == count
