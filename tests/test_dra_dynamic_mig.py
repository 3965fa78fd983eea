"""Dynamic MIG (`dra serve --mig-mode dynamic`) publishing, through the real code on the
simulated libnvidia-ml.so.1 (whose placements are NVIDIA's; the Python fake cannot change its
MIG layout, so the C library is the oracle here): every MIG-capable GPU whole and as every
profile x placement with NVIDIA's names, one counter set per GPU in slices of their own that
the API-server stand-in accepts under 1.37's rules, counters that admit exactly the combinations
the library can create, and an Xid taking out a GPU's every device (Prepare and Unprepare of a
partition: test_dra_dynamic_mig_prepare.py)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pynvml as n
import pytest
import yaml
from test_sim_library import opened, sim_root
from test_sim_library_dynamic_mig import A100_PLACEMENTS, placement

from deviceplugin.cli import parse_options
from deviceplugin.model.migpartitions import MIG_MODE_ENV, counter_sets
from deviceplugin.model.owners import Held, Holdings
from deviceplugin.model.quantity import parse_quantity
from deviceplugin.model.slices import build_devices, build_slices, quantity
from deviceplugin.node.discovery import discover
from deviceplugin.runtime.options import DraServeOptions, ExplainOptions
from tests.draplugin import published, run, running_driver

ROOT = Path(__file__).resolve().parent.parent
PRESET = "a100-80gb-x8-dynamic"
# A100-80GB: profile id -> name (NVIDIA's `nvidia-smi mig -lgip`), 25 partitions per GPU.
PROFILES = {
    19: "1g.10gb",
    20: "1g.10gb+me",
    15: "1g.20gb",
    14: "2g.20gb",
    9: "3g.40gb",
    5: "4g.40gb",
    0: "7g.80gb",
}
COUNTERS = {
    "multiprocessors",
    "copy-engines",
    "decoders",
    "encoders",
    "jpeg-engines",
    "ofa-engines",
    "memory",
    *(f"memory-slice-{i}" for i in range(8)),
}

JsonObject = dict[str, Any]


def expected_names(minor: int) -> set[str]:
    names = {f"gpu-{minor}"}
    for profile_id, places in A100_PLACEMENTS.items():
        label = PROFILES[profile_id].replace(".", "").replace("+", "-")
        names |= {f"gpu-{minor}-mig-{label}-{profile_id}-{start}" for start, _ in places}
    return names


def slice_specs(node: Any) -> list[JsonObject]:
    return [s["spec"] for s in node.server.slices.values()]


def fits(devices: list[JsonObject], sets: dict[str, JsonObject]) -> bool:
    """The scheduler's rule for partitionable devices: what the devices consume together stays
    within every counter of every set."""
    used: Counter[tuple[str, str]] = Counter()
    for device in devices:
        for consumed in device.get("consumesCounters") or []:
            for name, counter in consumed["counters"].items():
                used[(consumed["counterSet"], name)] += parse_quantity(counter["value"])
    return all(
        amount <= parse_quantity(sets[counter_set][name]["value"])
        for (counter_set, name), amount in used.items()
    )


def test_every_mig_capable_gpu_is_published_whole_and_as_every_placement() -> None:
    async def body() -> None:
        async with running_driver(PRESET, library=True, mig_mode="dynamic") as node:
            assert node.server.rejected == []
            devices = published(node.server)
            gpus = node.driver.inventory.gpus if node.driver.inventory else ()
            assert len(gpus) == 8
            assert set(devices) == set().union(*(expected_names(g.minor) for g in gpus))
            specs = slice_specs(node)
            counter_slices = [s for s in specs if "sharedCounters" in s]
            device_slices = [s for s in specs if "devices" in s]
            # 8 sets fill one slice of their own; 208 devices in slices of at most 64
            assert [len(s["sharedCounters"]) for s in counter_slices] == [8]
            assert sorted(len(s["devices"]) for s in device_slices) == [16, 64, 64, 64]
            for spec in specs:
                assert spec["pool"]["resourceSliceCount"] == len(specs)
            for item in node.server.slices.values():
                assert kubernetes_validate.validate(item, "1.37", strict=True) == "1.37"
            (sets,) = counter_slices
            names = [s["name"] for s in sets["sharedCounters"]]
            assert names == [f"gpu-{g.minor}-counter-set" for g in gpus]
            for counter_set in sets["sharedCounters"]:
                assert set(counter_set["counters"]) == COUNTERS

    run(body)


def test_a_partition_carries_its_profile_parent_placement_and_what_it_consumes() -> None:
    async def body() -> None:
        async with running_driver(PRESET, library=True, mig_mode="dynamic") as node:
            devices = published(node.server)
            gpu = node.driver.inventory.gpus[0] if node.driver.inventory else None
            assert gpu is not None
            three = devices[f"gpu-{gpu.minor}-mig-3g40gb-9-4"]
            attributes = three["attributes"]
            assert attributes["type"] == {"string": "mig"}
            assert attributes["profile"] == {"string": "3g.40gb"}
            assert attributes["nvidia.com/migProfile"] == {"string": "3g.40gb"}
            assert attributes["parentUUID"] == {"string": gpu.uuid}
            assert attributes["nvidia.com/parentUUID"] == {"string": gpu.uuid}
            assert (attributes["placementStart"], attributes["placementSize"]) == (
                {"int": 4},
                {"int": 4},
            )
            assert "uuid" not in attributes  # nothing is cut yet
            (consumed,) = three["consumesCounters"]
            assert consumed["counterSet"] == f"gpu-{gpu.minor}-counter-set"
            slices = {k for k in consumed["counters"] if k.startswith("memory-slice-")}
            assert slices == {f"memory-slice-{i}" for i in range(4, 8)}
            assert parse_quantity(consumed["counters"]["multiprocessors"]["value"]) == 42
            whole = devices[f"gpu-{gpu.minor}"]
            (everything,) = whole["consumesCounters"]
            sets = [s for spec in slice_specs(node) for s in spec.get("sharedCounters") or []]
            own = next(s for s in sets if s["name"] == everything["counterSet"])
            assert everything["counters"] == own["counters"]

    run(body)


@pytest.fixture(scope="module")
def dynamic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_root(PRESET, tmp_path_factory.mktemp("dynamic"))


def test_the_counters_admit_exactly_the_pairs_the_library_can_create(dynamic_root: Path) -> None:
    """Every pair of GPU 0's devices: the counters let the scheduler allocate both exactly when
    the simulated library creates both GPU instances (NVIDIA's placements and engines)."""
    nvml = opened(dynamic_root)
    try:
        inventory = discover(nvml, mig_profiles=True)
        sets = {s["name"]: s["counters"] for s in counter_sets(inventory, quantity)}
        gpu = n.nvmlDeviceGetHandleByIndex(0)
        ours = [
            d
            for d in build_devices(inventory, dynamic_mig=True)
            if d["attributes"]["nvidia.com/parentUUID"]["string"] == inventory.gpus[0].uuid
        ]
        assert len(ours) == 26
        disagree = []
        for one, two in itertools.combinations(ours, 2):
            if fits([one, two], sets) != _creatable(gpu, one, two):
                disagree.append((one["name"], two["name"]))
        assert disagree == []
    finally:
        nvml.shutdown()


@pytest.mark.parametrize(
    ("starts", "fit"),
    [
        pytest.param([("1g10gb-19", s) for s in range(7)], True, id="seven-1g"),
        pytest.param([("3g40gb-9", 4)] + [("1g10gb-19", s) for s in range(4)], True, id="3g-4x1g"),
        pytest.param([("3g40gb-9", 0), ("3g40gb-9", 4), ("1g10gb-19", 6)], False, id="3g-3g-1g"),
        pytest.param([("4g40gb-5", 0), ("3g40gb-9", 4)], True, id="4g-3g"),
        pytest.param([("1g10gb-me-20", 0), ("1g10gb-me-20", 1)], False, id="two-media"),
    ],
)
def test_the_issues_combinations_fit_as_the_hardware_allows(
    dynamic_root: Path, starts: list[tuple[str, int]], fit: bool
) -> None:
    nvml = opened(dynamic_root)
    try:
        inventory = discover(nvml, mig_profiles=True)
    finally:
        nvml.shutdown()
    devices = {d["name"]: d for d in build_devices(inventory, dynamic_mig=True)}
    sets = {s["name"]: s["counters"] for s in counter_sets(inventory, quantity)}
    chosen = [devices[f"gpu-0-mig-{label}-{start}"] for label, start in starts]
    assert fits(chosen, sets) is fit
    assert not fits([devices["gpu-0"], chosen[0]], sets)  # the whole GPU excludes any part


def _creatable(gpu: Any, *devices: JsonObject) -> bool:
    """Whether the library creates a GPU instance for each device (the whole GPU: nothing
    else on it), destroying what it created."""
    if any(d["attributes"]["type"]["string"] == "gpu" for d in devices):
        return False  # the whole GPU is one device: nothing else can hold a part of it
    created = []
    try:
        for device in devices:
            profile_id = int(device["name"].rsplit("-", 2)[1])
            start = device["attributes"]["placementStart"]["int"]
            size = device["attributes"]["placementSize"]["int"]
            try:
                at = placement(start, size)
                made = n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, profile_id, at)
                created.append(n.nvmlGpuInstanceGetInfo(made).id)
            except n.NVMLError:
                return False
        return True
    finally:
        for gi_id in created:  # by id: a handle is not kept across another create
            n.nvmlGpuInstanceDestroy(n.nvmlDeviceGetGpuInstanceById(gpu, gi_id))


def test_an_xid_takes_out_the_whole_gpu_and_every_partition_of_it() -> None:
    async def body() -> None:
        async with running_driver(PRESET, library=True, mig_mode="dynamic") as node:
            assert node.driver.inventory is not None
            sick, well = node.driver.inventory.gpus[:2]
            node.event(uuid=sick.uuid, xid=79)

            def tainted() -> set[str]:
                return {name for name, d in published(node.server).items() if d.get("taints")}

            await node.until(lambda: bool(tainted()), 10.0)
            await node.synced()
            assert tainted() == expected_names(sick.minor)
            devices = published(node.server)
            assert all(
                not devices[name]["attributes"]["nvidia.com/healthy"]["bool"]
                for name in expected_names(sick.minor)
            )
            assert all(
                devices[name]["attributes"]["nvidia.com/healthy"]["bool"]
                for name in expected_names(well.minor)
            )
            assert node.server.rejected == []

    run(body)


def test_memory_shares_leave_a_partitioned_gpu_unshared() -> None:
    async def body() -> None:
        async with running_driver(
            PRESET, library=True, mig_mode="dynamic", gpu_sharing="memory"
        ) as node:
            assert node.server.rejected == []
            for device in published(node.server).values():
                assert "allowMultipleAllocations" not in device
                assert device["attributes"]["nvidia.com/memoryShares"] == {"bool": False}

    run(body)


def test_static_mode_publishes_no_counters() -> None:
    async def body() -> None:
        async with running_driver(PRESET, library=True) as node:
            assert all("sharedCounters" not in spec for spec in slice_specs(node))
            assert published(node.server) == {}  # MIG on and no instance: nothing to run on

    run(body)


@pytest.mark.parametrize("command", [["dra", "serve"], ["dra", "explain", "--class", "c.yaml"]])
def test_the_flag_beats_the_variable_and_a_bad_value_is_refused(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    options = parse_options(command, {MIG_MODE_ENV: "dynamic"})
    assert isinstance(options, DraServeOptions | ExplainOptions)
    assert options.mig_mode == "dynamic"
    options = parse_options([*command, "--mig-mode", "static"], {MIG_MODE_ENV: "dynamic"})
    assert isinstance(options, DraServeOptions | ExplainOptions)
    assert options.mig_mode == "static"
    assert isinstance(parse_options(command, {}), DraServeOptions | ExplainOptions)
    with pytest.raises(SystemExit) as exit_info:
        parse_options([*command, "--mig-mode", "mixed"], {})
    assert exit_info.value.code == 2
    assert "--mig-mode / DP_DRA_MIG_MODE must be static or dynamic" in capsys.readouterr().err


def test_the_dynamic_overlay_runs_the_driver_on_a_node_of_its_own() -> None:
    overlay = ROOT / "manifests" / "overlays" / "simulated-node-dra-dynamic-mig"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../simulated-node-dra"]
    (patch,) = kustomization["patches"]
    daemonset = yaml.safe_load((overlay / patch["path"]).read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[MIG_MODE_ENV] == "dynamic"
    assert env["NVIDIA_DRIVER_ROOT"] == "/var/lib/deviceplugin-sim/dynamic-root"


def test_slices_of_a_node_with_more_gpus_than_a_slice_has_counter_sets(dynamic_root: Path) -> None:
    """Counter sets are cut at 8 per slice, the 1.37 limit: a 16-GPU node needs two."""
    nvml = opened(dynamic_root)
    try:
        inventory = discover(nvml, mig_profiles=True)
    finally:
        nvml.shutdown()
    more = tuple(replace(g, index=g.index + 8, minor=g.minor + 8) for g in inventory.gpus)
    bigger = replace(inventory, gpus=inventory.gpus + more, links={})
    devices = build_devices(bigger, dynamic_mig=True)
    items = build_slices("node-1", devices, 1, counter_sets=counter_sets(bigger, quantity))
    assert [len(i["spec"].get("sharedCounters") or []) for i in items[:3]] == [8, 8, 0]
    for item in items:
        assert kubernetes_validate.validate(item, "1.37", strict=True) == "1.37"


def test_a_gpu_a_device_plugin_pod_holds_is_withheld_whole_with_its_partitions(
    dynamic_root: Path,
) -> None:
    """Migration: a GPU (or a MIG device of it) a departed plugin's pod holds publishes neither
    the GPU nor any partition of it; the other GPUs are published as before."""
    nvml = opened(dynamic_root)
    try:
        inventory = discover(nvml, mig_profiles=True)
    finally:
        nvml.shutdown()
    every = build_devices(inventory, dynamic_mig=True)
    held_gpu = inventory.gpus[2]
    prefix = f"gpu-{held_gpu.minor}"
    on_held = {d["name"] for d in every if d["name"].partition("-mig-")[0] == prefix}
    assert len(on_held) > 1  # the whole GPU and its partitions
    for mig in (None, "MIG-of-it"):
        withheld = Holdings([Held(held_gpu.uuid, mig, "team/trainer", "nvidia.com/gpu x")])
        names = {d["name"] for d in build_devices(inventory, dynamic_mig=True, withheld=withheld)}
        assert names == {d["name"] for d in every} - on_held
