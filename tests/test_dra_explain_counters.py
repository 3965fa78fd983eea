"""`dra explain --mig-mode dynamic`: claims allocated against shared counters (partitionable
devices) as Kubernetes 1.37's allocator does, on the `a100-80gb-x8-dynamic` preset: how many
partitions of which profiles fit on one A100, the whole GPU and its partitions excluding each
other, which counter of which set ran out when a claim does not fit, the pools the allocator
refuses, and a property test against what the simulated C library can really create."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pynvml as n
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dra_dynamic_mig import PROFILES as PROFILE_NAMES
from test_sim_library import opened, sim_root
from test_sim_library_dynamic_mig import placement, placements

from deviceplugin.__main__ import main
from deviceplugin.explain.claims import Candidate, allocate, allocate_all
from deviceplugin.explain.command import ExplainOptions, node_slices
from deviceplugin.explain.counters import SharedCounters
from deviceplugin.explain.resourceapi import Claim, DeviceClass, read_claims, read_classes

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ROOT / "manifests" / "dra" / "deviceclasses.yaml"
PRESET = "a100-80gb-x8-dynamic"
DRIVER = "gpu.nvidia.com"
PARENT = "gpu.nvidia.com/parentUUID"
SEED_PARENT = "nvidia.com/parentUUID"
PROFILE_IDS = {name: profile_id for profile_id, name in PROFILE_NAMES.items()}

JsonObject = dict[str, Any]


def request(name: str, profile: str | None = None, count: int = 1, **exactly: Any) -> JsonObject:
    """A v1 request for `count` partitions of `profile` (None: the whole GPU)."""
    if profile is None:
        return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}
    body: JsonObject = {"deviceClassName": "mig.nvidia.com", "count": count, **exactly}
    expression = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    body["selectors"] = [{"cel": {"expression": expression}}, *body.get("selectors", [])]
    return {"name": name, "exactly": body}


def on_gpu(uuid: str) -> list[JsonObject]:
    expression = f"device.attributes['nvidia.com'].parentUUID == '{uuid}'"
    return [{"cel": {"expression": expression}}]


def claim(name: str, *requests: JsonObject, match: str | None = PARENT) -> JsonObject:
    """A v1 ResourceClaim; with `match`, every request on one GPU (matchAttribute)."""
    devices: JsonObject = {"requests": list(requests)}
    if match:
        devices["constraints"] = [{"matchAttribute": match}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def explain(tmp_path: Path, capsys: pytest.CaptureFixture[str], *claims: JsonObject) -> Any:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all(claims))
    args = ["dra", "explain", "--simulate", PRESET, "--mig-mode", "dynamic", "-o", "json"]
    code = main([*args, "--class", str(CLASSES), "--claim", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def picked(report: JsonObject, index: int = 0) -> dict[str, list[str]]:
    entry = report["claims"][index]
    assert entry["failure"] == "", entry["failure"]
    devices: dict[str, list[str]] = entry["devices"]
    return devices


def failure(report: JsonObject, index: int = 0) -> str:
    why: str = report["claims"][index]["failure"]
    assert why, report["claims"][index]
    return why


def ones(*starts: int) -> list[str]:
    return [f"gpu-0-mig-1g10gb-19-{s}" for s in starts]


def test_seven_1g_10gb_fit_on_one_a100_and_nothing_more_fits_beside_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uuid = _uuid(tmp_path, capsys)
    eighth = {"name": "more", "exactly": {"deviceClassName": "mig.nvidia.com"}}
    eighth["exactly"]["selectors"] = on_gpu(uuid)  # any partition of that GPU
    report = explain(
        tmp_path,
        capsys,
        claim("seven", request("p", "1g.10gb", count=7)),
        claim("eighth", eighth),
        claim("eight", request("p", "1g.10gb", count=8)),
    )
    assert picked(report) == {"p": ones(*range(7))}
    why = failure(report, 1)
    # each 1g.10gb is held; every other partition needs a memory slice or engines left
    assert "25 match (7 held by an earlier claim, 18 without the counters left:" in why
    assert (
        "gpu-0-mig-2g20gb-14-0: counter set gpu-0-counter-set ran out of multiprocessors"
        " (28 wanted, 0 of 98 left)"
    ) in why
    # eight in one claim: no A100 has eight 1g.10gb placements
    assert failure(report, 2).startswith(
        f"no devices satisfy the requests together under matchAttribute {PARENT}"
    )


def test_3g_40gb_and_four_1g_10gb_fit_by_backtracking_to_the_second_placement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = explain(
        tmp_path, capsys, claim("mix", request("big", "3g.40gb"), request("p", "1g.10gb", 4))
    )
    # 3g.40gb at 0 leaves three 1g.10gb placements: the allocator moves it to 4
    assert picked(report) == {"big": ["gpu-0-mig-3g40gb-9-4"], "p": ones(0, 1, 2, 3)}


def test_two_3g_40gb_and_a_1g_10gb_do_not_fit_and_the_memory_slice_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = explain(
        tmp_path,
        capsys,
        claim("mix", request("a", "3g.40gb"), request("b", "3g.40gb"), request("c", "1g.10gb")),
    )
    why = failure(report)
    assert "no devices satisfy the requests together under matchAttribute" in why
    assert "with gpu-0-mig-3g40gb-9-0, gpu-0-mig-3g40gb-9-4 picked, c:" in why
    # 3g.40gb twice: 79Gi of memory and all eight memory slices are gone
    assert (
        "gpu-0-mig-1g10gb-19-0: counter set gpu-0-counter-set ran out of memory (9728Mi"
        " wanted, 512Mi of 79Gi left), memory-slice-0 (1 wanted, 0 of 1 left);"
    ) in why
    assert "and 4 more" in why  # the seven placements of 1g.10gb on that GPU, and no other


def test_the_whole_gpu_and_a_partition_of_it_never_coexist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uuid = _uuid(tmp_path, capsys)
    report = explain(
        tmp_path,
        capsys,
        # one claim, one GPU (the whole GPU has the seed's parentUUID, not NVIDIA's)
        claim("both", request("whole"), request("part", "1g.10gb"), match=SEED_PARENT),
        claim("whole", request("whole"), match=None),
        claim("part", request("part", "1g.10gb", selectors=on_gpu(uuid)), match=None),
        claim("elsewhere", request("part", "7g.80gb"), match=None),
        claim("then-whole", request("whole"), match=None),
    )
    assert "with gpu-0 picked, part: 7 without the counters left" in failure(report, 0)
    assert picked(report, 1) == {"whole": ["gpu-0"]}
    why = failure(report, 2)
    assert "7 without the counters left: gpu-0-mig-1g10gb-19-0: counter" in why
    assert "counter set gpu-0-counter-set ran out of multiprocessors" in why
    # a partition goes to the next GPU, and the whole of that GPU is no longer free
    assert picked(report, 3) == {"part": ["gpu-1-mig-7g80gb-0-0"]}
    assert picked(report, 4) == {"whole": ["gpu-2"]}


def _uuid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    report = explain(tmp_path, capsys, claim("probe", request("whole"), match=None))
    (device,) = [d for d in report["devices"] if d["name"] == "gpu-0"]
    uuid: str = device["uuid"]
    return uuid


# --- pools the allocator refuses, and shared devices --------------------------------------------


def pool(*devices: JsonObject, sets: tuple[JsonObject, ...] = ()) -> list[JsonObject]:
    """A pool's slices: the counter sets in slices of their own, then one of devices."""
    slices = [{"spec": {"sharedCounters": [s]}} for s in sets]
    return [*slices, {"spec": {"devices": list(devices)}}]


def device(name: str, counter_set: str = "set", **counters: int) -> JsonObject:
    used = {
        "counterSet": counter_set,
        "counters": {k: {"value": str(v)} for k, v in counters.items()},
    }
    return {"name": name, "consumesCounters": [used]} if counters else {"name": name}


def counter_set(name: str = "set", **counters: int) -> JsonObject:
    return {"name": name, "counters": {k: {"value": str(v)} for k, v in counters.items()}}


ANY = {"any": DeviceClass("any")}


def one_claim(count: int = 1, admin: bool = False) -> Claim:
    request = {"name": "r", "exactly": {"deviceClassName": "any", "count": count}}
    if admin:
        request["exactly"]["adminAccess"] = True
    document = claim("c", request, match=None)
    (parsed,) = read_claims([document], "claims.yaml")
    return parsed


def candidates(slices: list[JsonObject]) -> list[Candidate]:
    return [Candidate.of(DRIVER, d) for s in slices for d in s["spec"].get("devices") or ()]


@pytest.mark.parametrize(
    ("slices", "reason"),
    [
        pytest.param(
            pool(device("a", "missing", c=1), sets=(counter_set(c=1),)),
            "device a: counter set missing not found",
            id="set-not-published",
        ),
        pytest.param(
            pool(device("a", d=1), sets=(counter_set(c=1),)),
            "device a: counter d not found in counter set set",
            id="counter-not-in-set",
        ),
        pytest.param(
            pool(device("a"), sets=(counter_set(c=1), counter_set(c=2))),
            "duplicate counter set name set",
            id="duplicate-set",
        ),
    ],
)
def test_a_pool_the_allocator_refuses_gives_no_device(
    slices: list[JsonObject], reason: str
) -> None:
    counters = SharedCounters.of(slices)
    assert counters.invalid == reason
    (allocation,) = allocate_all([one_claim()], ANY, candidates(slices), counters)
    assert allocation.failure == (
        f"the scheduler refuses the node's resource pool: {reason} (it allocates none of its"
        " devices)"
    )
    # the same devices with no counters in the way
    assert allocate(one_claim(), ANY, candidates(pool(device("a")))).devices == {"r": ("a",)}


def test_earlier_claims_consume_counters_and_admin_access_reserves_them_in_its_claim() -> None:
    slices = pool(device("a", c=2), device("b", c=2), device("c", c=1), sets=(counter_set(c=4),))
    counters = SharedCounters.of(slices)
    found = allocate_all(
        [one_claim(2), one_claim(), one_claim()], ANY, candidates(slices), counters
    )
    assert found[0].devices == {"r": ("a", "b")}
    assert found[2].failure == found[1].failure  # a and b took all 4
    assert "c: counter set set ran out of c (1 wanted, 0 of 4 left)" in found[1].failure
    # an admin-access request reserves counters too (1.37; kubernetes#140729)
    (admin,) = allocate_all([one_claim(3, admin=True)], ANY, candidates(slices), counters)
    assert "with a, b picked, r: 1 without the counters left: c: counter set" in admin.failure


def test_a_shared_device_reserves_its_counters_once_for_all_its_shares() -> None:
    shared = {**device("s", c=3), "allowMultipleAllocations": True}
    slices = pool(shared, device("x", c=2), sets=(counter_set(c=4),))
    counters = SharedCounters.of(slices)
    devices = candidates(slices)
    found = allocate_all([one_claim(), one_claim(), one_claim()], ANY, devices, counters)
    # s twice (its counters once: 3 of 4), then x would need 2 more
    assert [a.devices for a in found[:2]] == [{"r": ("s",)}, {"r": ("s",)}]
    assert found[2].devices == {"r": ("s",)}
    (both,) = allocate_all([one_claim(2)], ANY, devices, counters)
    assert "x: counter set set ran out of c (2 wanted, 1 of 4 left)" in both.failure


# --- against the simulated library ---------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu0(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """GPU 0 of the preset through nvidia-ml-py on the simulated C library (a sim-root)."""
    nvml = opened(sim_root(PRESET, tmp_path_factory.mktemp("dynamic")))
    try:
        yield n.nvmlDeviceGetHandleByIndex(0)
    finally:
        nvml.shutdown()


@pytest.fixture(scope="module")
def node() -> tuple[list[Candidate], SharedCounters, dict[str, DeviceClass]]:
    """GPU 0's devices as `dra explain` publishes them, its pool's counters and the classes."""
    options = ExplainOptions(class_file=str(CLASSES), simulate=PRESET, mig_mode="dynamic")
    slices = node_slices(options)
    devices = [c for c in candidates(slices) if c.name == "gpu-0" or c.name.startswith("gpu-0-")]
    classes = read_classes(yaml.safe_load_all(CLASSES.read_text()), str(CLASSES))
    return devices, SharedCounters.of(slices), classes


@settings(max_examples=60, deadline=None)
@given(mix=st.lists(st.sampled_from(sorted(PROFILE_IDS)), min_size=1, max_size=8))
def test_explain_allocates_a_mix_on_one_gpu_exactly_when_the_library_can_create_it(
    gpu0: Any, node: tuple[list[Candidate], SharedCounters, dict[str, DeviceClass]], mix: list[str]
) -> None:
    devices, counters, classes = node
    document = claim("mix", *(request(f"r{i}", p) for i, p in enumerate(mix)))
    (parsed,) = read_claims([document], "claims.yaml")
    allocation = allocate(parsed, classes, devices, counters=counters)
    by_name = {d.name: d for d in devices}
    if allocation.failure:
        assert "no devices satisfy" in allocation.failure or "not enough" in allocation.failure
        assert not _creatable_anywhere(gpu0, mix), allocation.failure
        return
    chosen = [by_name[name] for (name,) in allocation.devices.values()]
    placements = [(_profile_id(d), _start_size(d)) for d in chosen]
    assert _create(gpu0, placements), placements


def _profile_id(candidate: Candidate) -> int:
    return int(candidate.name.rsplit("-", 2)[1])


def _start_size(candidate: Candidate) -> tuple[int, int]:
    attributes = candidate.attributes
    return attributes["placementStart"]["int"], attributes["placementSize"]["int"]


def _create(gpu: Any, wanted: list[tuple[int, tuple[int, int]]]) -> bool:
    """Whether the library creates a GPU instance at each (profile id, placement); what it
    created is destroyed again."""
    created = []
    try:
        for profile_id, (start, size) in wanted:
            try:
                made = n.nvmlDeviceCreateGpuInstanceWithPlacement(
                    gpu, profile_id, placement(start, size)
                )
            except n.NVMLError:
                return False
            created.append(n.nvmlGpuInstanceGetInfo(made).id)
        return True
    finally:
        for gi_id in created:
            n.nvmlGpuInstanceDestroy(n.nvmlDeviceGetGpuInstanceById(gpu, gi_id))


def _creatable_anywhere(gpu: Any, mix: list[str]) -> bool:
    """Whether some choice of NVIDIA's placements (from the library) holds the whole mix, tried
    in the library; a profile's instances in rising placement order, to skip permutations."""
    options = []
    for profile in sorted(set(mix)):
        profile_id = PROFILE_IDS[profile]
        places = itertools.combinations(placements(gpu, profile_id), mix.count(profile))
        options.append([[(profile_id, place) for place in group] for group in places])
    return any(
        _create(gpu, [item for group in choice for item in group])
        for choice in itertools.product(*options)
    )
