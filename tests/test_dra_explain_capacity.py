"""`dra explain` with consumable capacity: memory shares of whole GPUs counted as the
Kubernetes 1.37 scheduler counts them (rounding up by the requestPolicy, refusing what it cannot
hold, summing shares per GPU), on the devices `dra serve --gpu-sharing memory` publishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.__main__ import main
from deviceplugin.explain.capacity import Capacity, Policy, Range, consumed_amount, violation
from deviceplugin.explain.claims import Candidate, allocate_all
from deviceplugin.explain.resourceapi import read_claims, read_classes
from deviceplugin.model.memoryshares import SHARE_MIN, SHARE_STEP
from deviceplugin.model.slices import build_devices
from tests.dranode import inventory

ROOT = Path(__file__).resolve().parent.parent
SHARED_CLASSES = ROOT / "manifests" / "dra" / "deviceclasses-shares.yaml"
CLASSES = ROOT / "manifests" / "dra" / "deviceclasses.yaml"
SHARED = "gpu-shared.nvidia.com"
A100 = "a100-80gb-x8-mixed"  # GPUs 4-7 whole, 80Gi each
H100 = "h100-x8"  # 81559Mi each: not whole GiB
GI = 1 << 30
MI = 1 << 20


def gpu_uuid(preset: str, index: int) -> str:
    return next(g.uuid for g in inventory(preset).gpus if g.index == index)


def request(
    name: str = "gpu",
    memory: object = None,
    uuid: str | None = None,
    device_class: str = SHARED,
    **fields: Any,
) -> dict[str, Any]:
    """A v1 request of `device_class`, for `memory` (none: no capacity), on the GPU `uuid`."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, **fields}
    if uuid is not None:
        expression = f"device.attributes['gpu.nvidia.com'].uuid == '{uuid}'"
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"name": name, "exactly": exactly}


def claim(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": list(requests)}},
    }


def explain(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    *claims: dict[str, Any],
    preset: str = A100,
    sharing: str = "memory",
    classes: Path = SHARED_CLASSES,
) -> list[dict[str, Any]]:
    """Each claim's report from `dra explain -o json` on the node, one after the other."""
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all(claims))
    args = ["dra", "explain", "--class", str(classes), "--claim", str(path), "-o", "json"]
    code = main([*args, "--simulate", preset, "--gpu-sharing", sharing])
    out = capsys.readouterr().out
    assert code == 0, out
    reports: list[dict[str, Any]] = json.loads(out)["claims"]
    return reports


def shares(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(device, consumed memory) of each share of a claim."""
    return [(r["device"], r["consumedCapacity"]["memory"]) for r in report["results"] if r["share"]]


# --- the policy's arithmetic --------------------------------------------------------------------

RANGE = Capacity(80 * GI, Policy(80 * GI, valid_range=Range(GI, 80 * GI, MI)))
VALUES = Capacity(40 * GI, Policy(None, valid_values=(10 * GI, 20 * GI, 40 * GI)))


@pytest.mark.parametrize(
    ("asked", "capacity", "consumed", "refused"),
    [
        pytest.param(None, RANGE, 80 * GI, "", id="no-request-takes-the-default"),
        pytest.param(None, Capacity(10 * GI), 10 * GI, "", id="no-policy-no-request-takes-all"),
        pytest.param(
            None, Capacity(8 * GI, Policy(valid_range=Range(GI))), 8 * GI, "", id="no-default"
        ),
        pytest.param(20 * GI, RANGE, 20 * GI, "", id="on-the-step"),
        pytest.param(512 * MI, RANGE, GI, "", id="below-min-rounds-up-to-min"),
        pytest.param(-GI, RANGE, GI, "", id="negative-rounds-up-to-min"),
        pytest.param(20 * GI + 1, RANGE, 20 * GI + MI, "", id="off-step-rounds-up-a-step"),
        pytest.param(100 * GI, RANGE, 100 * GI, "validRange.max 80Gi", id="above-max-refused"),
        pytest.param(
            80 * GI + 1, RANGE, 80 * GI + MI, "validRange.max", id="rounded-past-max-refused"
        ),
        pytest.param(
            2 * GI + 1,
            Capacity(8 * GI, Policy(valid_range=Range(max=8 * GI, step=GI))),
            2 * GI + 1,
            "validRange.step 1Gi from 0",
            id="no-min-no-rounding-off-step-refused",
        ),
        pytest.param(15 * GI, VALUES, 20 * GI, "", id="valid-values-round-up"),
        pytest.param(41 * GI, VALUES, 41 * GI, "validValues", id="above-every-valid-value"),
        pytest.param(99 * GI, Capacity(10 * GI), 99 * GI, "", id="no-policy-takes-the-request"),
    ],
)
def test_a_request_is_rounded_up_and_checked_as_the_scheduler_does(
    asked: int | None, capacity: Capacity, consumed: int, refused: str
) -> None:
    assert consumed_amount(asked, capacity) == consumed
    broken = violation(consumed, capacity)
    assert refused in broken and bool(broken) == bool(refused)


def test_the_published_policy_reads_back_as_published() -> None:
    (whole, *_) = [d for d in build_devices(inventory(H100), memory_shares=True)]
    capacity = Candidate.of("gpu.nvidia.com", whole).capacity["memory"]
    total = 81559 * MI
    assert capacity == Capacity(total, Policy(total, (), Range(SHARE_MIN, total, SHARE_STEP)))


# --- dra explain, end to end --------------------------------------------------------------------


def test_four_20gi_shares_fill_an_80gb_gpu_and_a_fifth_waits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The issue's check: four pods of 20Gi on one pinned GPU, the fifth stays Pending."""
    uuid = gpu_uuid(A100, 4)
    claims = [claim(f"c{n}", request(memory="20Gi", uuid=uuid)) for n in range(5)]
    *placed, fifth = explain(capsys, tmp_path, *claims)
    assert [shares(r) for r in placed] == [[("gpu-4", "20Gi")]] * 4
    assert all(r["failure"] == "" and r["notes"] == [] for r in placed)
    assert fifth["devices"] == {} and fifth["results"] == []
    assert "gpu: 1 wanted, 1 match (1 without the capacity:" in fifth["failure"]
    assert "gpu-4: memory 20Gi wanted, 0 of 80Gi left" in fifth["failure"]


def test_unpinned_shares_fill_the_first_gpu_with_room_in_slice_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sizes = ["60Gi", "30Gi", "20Gi", "50Gi", "10Gi"]
    claims = [claim(f"c{n}", request(memory=size)) for n, size in enumerate(sizes)]
    reports = explain(capsys, tmp_path, *claims)
    assert [shares(r) for r in reports] == [
        [("gpu-4", "60Gi")],
        [("gpu-5", "30Gi")],  # 20Gi left on gpu-4
        [("gpu-4", "20Gi")],
        [("gpu-5", "50Gi")],  # just fits the 50Gi left on gpu-5
        [("gpu-6", "10Gi")],  # gpu-4 and gpu-5 are full
    ]


def test_a_claim_that_asks_no_capacity_gets_the_gpu_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    uuid = gpu_uuid(H100, 3)
    alone, after = explain(
        capsys,
        tmp_path,
        claim("alone", request(uuid=uuid)),
        claim("after", request(memory="1Gi", uuid=uuid)),
        preset=H100,
    )
    assert shares(alone) == [("gpu-3", "81559Mi")]  # the policy's default: all of it
    assert "gpu-3: memory 1Gi wanted, 0 of 81559Mi left" in after["failure"]
    share, late = explain(
        capsys,
        tmp_path,
        claim("share", request(memory="1Gi", uuid=uuid)),
        claim("late", request(uuid=uuid)),
        preset=H100,
    )
    assert shares(share) == [("gpu-3", "1Gi")]
    assert (
        "gpu-3: memory 81559Mi (nothing asked: the default) wanted, 80535Mi of 81559Mi left"
        in late["failure"]
    )


def test_requests_of_one_claim_share_one_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    uuid = gpu_uuid(H100, 0)
    two = (request("a", "40000Mi", uuid), request("b", "40000Mi", uuid))
    both, third = explain(
        capsys,
        tmp_path,
        claim("both", *two),
        claim("three", *two, request("c", "2Gi", uuid)),
        preset=H100,
    )
    assert shares(both) == [("gpu-0", "40000Mi"), ("gpu-0", "40000Mi")]
    assert both["devices"] == {"a": ["gpu-0"], "b": ["gpu-0"]}
    # the first claim took 80000Mi: the second finds 1559Mi, not enough for its first request
    assert "gpu-0: memory 40000Mi wanted, 1559Mi of 81559Mi left" in third["failure"]
    (alone,) = explain(
        capsys, tmp_path, claim("three", *two, request("c", "2Gi", uuid)), preset=H100
    )
    # each request fits alone; together they do not, and explain says so
    assert alone["failure"].startswith("the requests cannot all be met at once")


def test_a_count_takes_shares_of_distinct_gpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (report,) = explain(capsys, tmp_path, claim("pair", request(memory="10Gi", count=2)))
    assert shares(report) == [("gpu-4", "10Gi"), ("gpu-5", "10Gi")]


def test_all_mode_takes_a_share_of_every_gpu_with_room(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    uuid = gpu_uuid(A100, 5)
    big, every = explain(
        capsys,
        tmp_path,
        claim("big", request(memory="75Gi", uuid=uuid)),
        claim("every", request(memory="10Gi", allocationMode="All")),
    )
    assert shares(big) == [("gpu-5", "75Gi")]
    # gpu-5 has 5Gi left: "All" leaves it out rather than failing
    assert shares(every) == [("gpu-4", "10Gi"), ("gpu-6", "10Gi"), ("gpu-7", "10Gi")]
    (none,) = explain(capsys, tmp_path, claim("none", request(memory="81Gi", allocationMode="All")))
    assert none["failure"].startswith("not enough devices (gpu: all wanted, 0 match (4 without")


def test_a_share_with_admin_access_leaves_the_capacity_to_later_claims(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    uuid = gpu_uuid(A100, 6)
    monitor, owner = explain(
        capsys,
        tmp_path,
        claim("monitor", request(memory="80Gi", uuid=uuid, adminAccess=True)),
        claim("owner", request(memory="80Gi", uuid=uuid)),
    )
    assert shares(monitor) == [("gpu-6", "80Gi")] and monitor["adminAccess"] == ["gpu"]
    assert shares(owner) == [("gpu-6", "80Gi")]


@pytest.mark.parametrize(
    ("memory", "consumed", "note"),
    [
        pytest.param(
            "300Mi",
            "1Gi",
            "300Mi is below the requestPolicy's validRange.min 1Gi: the scheduler rounds it up"
            " to 1Gi",
            id="below-min",
        ),
        pytest.param(
            "20G",  # 20,000,000,000 bytes: not whole MiB
            "19074Mi",
            "19531250Ki is off the requestPolicy's validRange.step 1Mi from 1Gi: the scheduler"
            " rounds it up to 19074Mi",
            id="off-step",
        ),
        pytest.param(1 << 34, "16Gi", "", id="a-number-on-the-step"),
    ],
)
def test_a_request_the_policy_rounds_up_is_allocated_and_noted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, memory: object, consumed: str, note: str
) -> None:
    (report,) = explain(capsys, tmp_path, claim("odd", request(memory=memory)))
    assert shares(report) == [("gpu-4", consumed)]
    assert report["notes"] == ([f"gpu: gpu-4: capacity memory: {note}"] if note else [])


def test_a_request_above_the_gpus_memory_is_refused_on_every_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (report,) = explain(capsys, tmp_path, claim("huge", request(memory="81Gi")), preset=H100)
    failure = report["failure"]
    assert failure.startswith("not enough devices (gpu: 1 wanted, 8 match (8 without the capacity:")
    assert "gpu-0: memory 81Gi is above the requestPolicy's validRange.max 81559Mi" in failure
    assert "; and 5 more" in failure


def test_a_capacity_the_device_does_not_publish_is_not_found(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    qualified = claim(
        "q",
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": SHARED,
                "capacity": {"requests": {"gpu.nvidia.com/memory": "1Gi"}},
            },
        },
    )
    (report,) = explain(capsys, tmp_path, qualified)
    assert "gpu-4: no capacity gpu.nvidia.com/memory (it publishes: memory)" in report["failure"]


def test_without_sharing_a_capacity_request_picks_a_device_that_goes_whole(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gpu = {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": "20Gi"}}}
    mig = {"deviceClassName": "mig.nvidia.com", "capacity": {"requests": {"memory": "20Gi"}}}
    whole, next_whole, no_mig = explain(
        capsys,
        tmp_path,
        claim("whole", {"name": "gpu", "exactly": gpu}),
        claim("next", {"name": "gpu", "exactly": gpu}),
        claim("mig", {"name": "mig", "exactly": mig}),
        sharing="off",
        classes=CLASSES,
    )
    assert whole["devices"] == {"gpu": ["gpu-4"]} and shares(whole) == []
    assert whole["results"] == [{"request": "gpu", "device": "gpu-4", "share": False}]
    assert "gpu-4 does not allow multiple allocations" in whole["notes"][0]
    assert next_whole["devices"] == {"gpu": ["gpu-5"]}  # gpu-4 is held whole
    # a MIG device's memory is its capacity, without a policy: 20Gi is more than a 1g.10gb holds
    assert "gpu-0-mig-7-0: memory 20Gi wanted, 9728Mi of 9728Mi left" in no_mig["failure"]


def test_the_table_shows_shares(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(claim("small", request(memory="300Mi"))))
    args = ["dra", "explain", "--class", str(SHARED_CLASSES), "--claim", str(path)]
    assert main([*args, "--simulate", A100, "--gpu-sharing", "memory"]) == 0
    table = capsys.readouterr().out
    assert "ResourceClaim small (resource.k8s.io/v1): would be allocated\n" in table
    assert "  gpu: gpu-4 (share: memory 1Gi)\n" in table
    assert "  note: gpu: gpu-4: capacity memory: 300Mi is below" in table


@pytest.mark.parametrize(
    ("requests", "fragment"),
    [
        pytest.param(
            {"memory": "lots"},
            "capacity.requests[memory]: must be a quantity (20Gi), got 'lots'",
            id="not-a-quantity",
        ),
        pytest.param(
            {"memory": True},
            "capacity.requests[memory]: must be a quantity (20Gi), got true",
            id="a-bool",
        ),
        pytest.param(
            {"gpu memory": "1Gi"},
            "capacity.requests[gpu memory]: 'gpu memory' must be a capacity name",
            id="bad-name",
        ),
        pytest.param([], "capacity.requests: must be a mapping", id="not-a-mapping"),
    ],
)
def test_a_malformed_capacity_request_names_its_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, requests: object, fragment: str
) -> None:
    bad = claim(
        "bad",
        {"name": "gpu", "exactly": {"deviceClassName": SHARED, "capacity": {"requests": requests}}},
    )
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    args = ["dra", "explain", "--class", str(SHARED_CLASSES), "--claim", str(path)]
    assert main([*args, "--simulate", A100, "--gpu-sharing", "memory"]) == 2
    err = capsys.readouterr().err
    assert f"spec.devices.requests[0].exactly.{fragment}" in err, err


# --- any mix of requests --------------------------------------------------------------------------

ON_NODE = [
    Candidate.of("gpu.nvidia.com", d) for d in build_devices(inventory(H100), memory_shares=True)
]
TOTAL = 81559 * MI
CLASS = read_classes(yaml.safe_load_all(SHARED_CLASSES.read_text()), "shares")
# A request in bytes: small, near the minimum, near a step, up to past the GPU's memory.
SIZES = st.one_of(
    st.integers(0, 2 * GI),
    st.integers(1, 90).map(lambda n: n * GI),
    st.integers(0, TOTAL + 2 * GI),
)


def rounded(asked: int) -> int:
    """The scheduler's consumption, stated from the policy as published: at least 1Gi, whole MiB."""
    return max(SHARE_MIN, -(-asked // SHARE_STEP) * SHARE_STEP)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SIZES, min_size=1, max_size=12), st.booleans())
def test_any_mix_of_requests_never_overcommits_and_fits_whenever_it_can(
    sizes: list[int], pinned: bool
) -> None:
    uuid = gpu_uuid(H100, 2) if pinned else None
    documents = [claim(f"c{n}", request(memory=size, uuid=uuid)) for n, size in enumerate(sizes)]
    allocations = allocate_all(read_claims(documents, "mix"), CLASS, ON_NODE)
    used: dict[str, int] = {}
    for size, allocation in zip(sizes, allocations, strict=True):
        room = [d.name for d in ON_NODE if used.get(d.name, 0) + rounded(size) <= TOTAL]
        if pinned:
            room = [name for name in room if name == "gpu-2"]
        if not room:
            assert allocation.failure and not allocation.devices
            continue
        # the first GPU in slice order with room for the rounded request takes it
        assert allocation.devices == {"gpu": (room[0],)}
        assert allocation.shares == {"gpu": {room[0]: {"memory": rounded(size)}}}
        used[room[0]] = used.get(room[0], 0) + rounded(size)
    assert all(total <= TOTAL for total in used.values())
