"""NVIDIA's DRA driver with `DynamicMIG=true` and `dra serve --mig-mode dynamic`, one after the
other on the same simulated node (dynamicmig.py): the same counter sets, counters, partitions
and consumption; a claim for one partition, prepared by either through the kubelet's DRA
socket, leaves the same GPU and compute instance in the simulated library and nothing once
unprepared. Every other difference is documented (docs/compatibility.md, "Dynamic MIG") and
still shows. Runs in `make e2e` (root: NVIDIA's driver runs in a mount namespace)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from e2e.reference import dynamicmig
from e2e.reference.dynamicmig import KNOWN, OURS, PARTITION, REFERENCE, Outcome, explain
from testbed import plugins

# A100 80GB: 7 compute slices of 14 SMs, 8 memory slices; the largest of each engine over
# the profiles; memory the largest profile's (7g.80gb: 80896 MiB).
COUNTERS = {
    "multiprocessors": 98,
    "copy-engines": 7,
    "decoders": 5,
    "encoders": 0,
    "jpeg-engines": 1,
    "ofa-engines": 1,
    "memory": 80896 << 20,
    **{f"memory-slice-{i}": 1 for i in range(8)},
}
# Per GPU: 1g.10gb x7, 1g.10gb+me x7, 1g.20gb x4, 2g.20gb x3, 3g.40gb x2, 4g.40gb, 7g.80gb.
PARTITIONS_PER_GPU = 25
# PARTITION (3g.40gb, GPU-instance profile 9, at memory slices 4-7) with its full-size
# compute instance (profile 2, three slices), on an A100 whose MIG mode stays on.
CUT = {
    "gpu-0": {
        "migMode": 1,
        "gpuInstances": [
            {
                "profileId": 9,
                "placement": [4, 4],
                "computeInstances": [{"profileId": 2, "placement": [0, 3]}],
            }
        ],
    }
}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    try:
        binaries = plugins.runnable_binaries()
    except plugins.ReferenceUnavailable as exc:
        pytest.skip(str(exc))
    return asyncio.run(dynamicmig.run(binaries))


def test_the_same_counter_sets_and_partitions(outcomes: dict[str, Outcome]) -> None:
    sets = {name: dynamicmig.counter_sets(o.slices) for name, o in outcomes.items()}
    assert sets[OURS] == sets[REFERENCE] == {f"gpu-{m}-counter-set": COUNTERS for m in range(8)}
    partitions = {
        name: {d for d in dynamicmig.devices(o.slices) if "-mig-" in d}
        for name, o in outcomes.items()
    }
    assert partitions[OURS] == partitions[REFERENCE]
    assert len(partitions[OURS]) == 8 * PARTITIONS_PER_GPU


def test_a_claim_prepared_by_either_leaves_the_same_instances(
    outcomes: dict[str, Outcome],
) -> None:
    for outcome in outcomes.values():
        assert (outcome.error, outcome.prepared) == ("", [PARTITION])
        assert outcome.cut == CUT
        assert (outcome.unprepare_error, outcome.left) == ("", {})


def test_every_difference_is_documented_and_each_documented_one_shows(
    outcomes: dict[str, Outcome],
) -> None:
    differences = dynamicmig.compare(outcomes)
    assert [str(d) for d in differences if explain(d) is None] == []
    shown = {getattr(explain(d), "title", "") for d in differences}
    assert shown == {known.title for known in KNOWN}, "update docs/compatibility.md"


def test_each_documented_difference_has_its_heading() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "compatibility.md").read_text()
    assert [k.title for k in KNOWN if f"### {k.title}\n" not in docs] == []


def test_a_difference_nothing_documents_is_unexplained() -> None:
    """The comparison can fail: a partition only one side publishes, another cut."""
    consumes = [{"counterSet": "gpu-0-counter-set", "counters": {"memory-slice-0": {"value": "1"}}}]
    device = {"name": "gpu-0-mig-1g10gb-19-0", "consumesCounters": consumes}
    slices = [{"spec": {"devices": [device]}}]
    ours = Outcome(slices=slices, cut={"gpu-0": {"migMode": 1, "gpuInstances": []}})
    reference = Outcome(slices=[{"spec": {"devices": []}}], cut=CUT)
    found = dynamicmig.compare({OURS: ours, REFERENCE: reference})
    assert [d.field for d in found] == [
        "layout.deviceSlices",
        "devices.gpu-0-mig-1g10gb-19-0",
        "prepare.cut.gpu-0.gpuInstances",
    ]
    assert all(explain(d) is None for d in found)
