"""Health, compared (health.py): the same event lines to the reference plugin and to ours on
the same simulated node. Pins what docs/compatibility.md ("Health") says of each: where both
agree, where the reference marks too few or too many devices, and that only ours brings a
device back."""

from __future__ import annotations

import asyncio

import pytest

from deviceplugin.sim.node import Node, read_node, resolve_node_path
from e2e.reference import health
from testbed import plugins


@pytest.fixture(scope="module")
def seen() -> dict[str, dict[str, health.Seen]]:
    try:
        binaries = plugins.runnable_binaries()
    except plugins.ReferenceUnavailable as exc:
        pytest.skip(str(exc))
    return asyncio.run(health.run(binaries))


@pytest.fixture(scope="module")
def node() -> Node:
    return read_node(resolve_node_path(health.PRESET))


def _pair(seen: dict[str, dict[str, health.Seen]], number: int) -> tuple[health.Seen, health.Seen]:
    both = seen[health.SCENARIOS[number].name]
    assert not both["reference"].failed and not both["ours"].failed, both
    return both["reference"], both["ours"]


def test_both_mark_a_whole_gpu_for_a_critical_xid(
    seen: dict[str, dict[str, health.Seen]], node: Node
) -> None:
    for number in (0, 1):  # Xid 79, Xid 48
        reference, ours = _pair(seen, number)
        assert reference.unhealthy == ours.unhealthy == [health.whole_gpu(node)]


def test_both_ignore_an_application_xid(seen: dict[str, dict[str, health.Seen]]) -> None:
    reference, ours = _pair(seen, 2)
    assert reference.unhealthy == ours.unhealthy == []


def test_ours_marks_the_mig_device_the_event_names(
    seen: dict[str, dict[str, health.Seen]], node: Node
) -> None:
    reference, ours = _pair(seen, 3)
    assert ours.unhealthy == [health.first_mig(node)]
    # The reference keeps one MIG device per parent GPU (a map keyed by the parent's UUID), so
    # it marks this one only when it happens to be the one kept.
    assert set(reference.unhealthy) <= {health.first_mig(node)}


def test_a_gpu_in_mig_mode_takes_all_its_mig_devices(
    seen: dict[str, dict[str, health.Seen]], node: Node
) -> None:
    reference, ours = _pair(seen, 4)
    parent = next(gpu for gpu in node.gpus if gpu.mig_enabled)
    all_of_it = sorted(mig.uuid for mig in parent.mig_devices)
    assert ours.unhealthy == all_of_it
    assert len(reference.unhealthy) == 1 and set(reference.unhealthy) <= set(all_of_it)


def test_a_lost_gpu_takes_only_itself(seen: dict[str, dict[str, health.Seen]], node: Node) -> None:
    reference, ours = _pair(seen, 5)
    assert ours.unhealthy == [health.whole_gpu(node)]
    whole = sorted(gpu.uuid for gpu in node.gpus if not gpu.mig_enabled)
    assert reference.unhealthy == whole  # it cannot read the event's UUID: every device goes


def test_only_ours_brings_a_device_back(
    seen: dict[str, dict[str, health.Seen]], node: Node
) -> None:
    reference, ours = _pair(seen, 6)
    assert reference.unhealthy == ours.unhealthy == [health.whole_gpu(node)]
    assert ours.recovered_seconds is not None
    assert reference.recovered_seconds is None
