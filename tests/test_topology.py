"""Preferred allocation: pinned answers on hand-built topologies (whole GPUs, MIG packing,
replica spreading), safety and fallback, and properties over random nodes."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.model import topology
from deviceplugin.model.devices import Device, Gpu, Health, Inventory, Link, MigDevice, PcieLevel
from deviceplugin.model.gpuset import choose_gpus
from deviceplugin.model.resources import ResourceSet
from deviceplugin.model.topology import build_index, pair_score, preferred_allocation

NV4 = Link(nvlinks=4, pcie=PcieLevel.NODE)

# --- node builders: GPU i has UUID GPU-i, its MIG device j is MIG-i-j -------------------------


def node(
    numa: Sequence[int | None], links: Mapping[tuple[int, int], Link] | None = None
) -> Inventory:
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{i}",
            name="A100",
            memory_mib=81920,
            minor=i,
            pci_bus_id=f"{i}:0",
            numa_node=n,
        )
        for i, n in enumerate(numa)
    )
    return Inventory(gpus=gpus, links=dict(links or {}))


def gpu_device(index: int, numa: int | None = None) -> Device:
    uuid = f"GPU-{index}"
    return Device(
        id=uuid, physical_uuid=uuid, gpu_uuid=uuid, gpu_index=index, gpu_minor=index, numa_node=numa
    )


def mig_device(gpu: int, index: int) -> Device:
    uuid = f"MIG-{gpu}-{index}"
    profile = MigDevice(uuid, index, index + 7, 0, "1g.10gb", 9728, 1, 1)
    return replace(gpu_device(gpu), id=uuid, physical_uuid=uuid, mig=profile)


def replicated(devices: Iterable[Device], count: int) -> list[Device]:
    return [
        replace(d, id=f"{d.physical_uuid}::{n}", replica=n) for d in devices for n in range(count)
    ]


def resource(
    devices: Iterable[Device], unhealthy: Iterable[str] = (), replicas: int = 1
) -> ResourceSet:
    bad = set(unhealthy)
    marked = tuple(replace(d, health=Health.UNHEALTHY) if d.id in bad else d for d in devices)
    return ResourceSet(name="nvidia.com/test", devices=marked, replicas=replicas)


def whole(inventory: Inventory, unhealthy: Iterable[int] = ()) -> ResourceSet:
    devices = [gpu_device(g.index, g.numa_node) for g in inventory.gpus]
    return resource(devices, [f"GPU-{i}" for i in unhealthy])


def island_links(groups: Sequence[range], link: Link) -> dict[tuple[int, int], Link]:
    return {pair: link for group in groups for pair in combinations(group, 2)}


# Two NVLink islands of four, one per NUMA node; nothing links the islands (SYSTEM).
ISLANDS = node([0, 0, 0, 0, 1, 1, 1, 1], island_links([range(4), range(4, 8)], NV4))


def _dgx1() -> Inventory:
    """DGX-1 (V100) hybrid cube mesh: 0-3 and 4-7 fully connected, plus i <-> i+4; six NVLinks
    per GPU, so eight pairs carry two. PCIe: a switch per pair (0,1) (2,3) (4,5) (6,7), one NUMA
    node per half."""
    nvlinks = {
        (0, 1): 1,
        (0, 2): 1,
        (0, 3): 2,
        (0, 4): 2,
        (1, 2): 2,
        (1, 3): 1,
        (1, 5): 2,
        (2, 3): 2,
        (2, 6): 1,
        (3, 7): 1,
        (4, 5): 1,
        (4, 6): 1,
        (4, 7): 2,
        (5, 6): 2,
        (5, 7): 1,
        (6, 7): 2,
    }
    links = {}
    for a, b in combinations(range(8), 2):
        if a // 4 != b // 4:
            pcie = PcieLevel.SYSTEM
        else:
            pcie = PcieLevel.SINGLE if a // 2 == b // 2 else PcieLevel.NODE
        links[(a, b)] = Link(nvlinks=nvlinks.get((a, b), 0), pcie=pcie)
    return node([0, 0, 0, 0, 1, 1, 1, 1], links)


DGX1 = _dgx1()

# PCIe only: a switch per pair, two NUMA nodes of four.
PCIE_NUMA = node(
    [0, 0, 0, 0, 1, 1, 1, 1],
    {
        **island_links([range(4), range(4, 8)], Link(pcie=PcieLevel.NODE)),
        **island_links(
            [range(0, 2), range(2, 4), range(4, 6), range(6, 8)], Link(pcie=PcieLevel.SINGLE)
        ),
    },
)
# Node 0 has three GPUs on separate host bridges, node 1 a switch pair: the sum over pairs alone
# would take the switch pair plus a GPU across the SMP link.
SWITCH_ACROSS = node(
    [0, 0, 0, 1, 1],
    {
        (0, 1): Link(pcie=PcieLevel.NODE),
        (0, 2): Link(pcie=PcieLevel.NODE),
        (1, 2): Link(pcie=PcieLevel.NODE),
        (3, 4): Link(pcie=PcieLevel.SINGLE),
    },
)
# No links known at all: only NUMA tells the GPUs apart.
NUMA_ONLY = node([0, 1, 0, 1, 0, 1, 0, 1])
# Link counts differ pair by pair, PCIe unknown.
SKEWED = node(
    [None] * 4,
    {
        (0, 1): Link(nvlinks=1),
        (1, 2): Link(nvlinks=4),
        (2, 3): Link(nvlinks=2),
        (0, 3): Link(nvlinks=3),
    },
)


def choose(
    inventory: Inventory,
    size: int,
    taken: Iterable[int] = (),
    unhealthy: Iterable[int] = (),
    must: Sequence[int] = (),
    available: Iterable[int] | None = None,
) -> list[int]:
    """Preferred allocation on whole GPUs, in GPU indices; `taken` GPUs are not available."""
    pool = set(range(len(inventory.gpus)) if available is None else available) - set(taken)
    answer = preferred_allocation(
        whole(inventory, unhealthy),
        inventory,
        [f"GPU-{i}" for i in sorted(pool, reverse=True)],
        [f"GPU-{i}" for i in must],
        size,
    )
    return [int(device_id.removeprefix("GPU-")) for device_id in answer]


WHOLE_CASES = [
    pytest.param(ISLANDS, 1, (), (), (), [0], id="islands-k1"),
    pytest.param(ISLANDS, 2, (), (), (), [0, 1], id="islands-k2-one-island"),
    pytest.param(ISLANDS, 3, (), (), (), [0, 1, 2], id="islands-k3"),
    pytest.param(ISLANDS, 4, (), (), (), [0, 1, 2, 3], id="islands-k4-whole-island"),
    pytest.param(ISLANDS, 5, (), (), (), [0, 1, 2, 3, 4], id="islands-k5-island-plus-one"),
    pytest.param(ISLANDS, 8, (), (), (), list(range(8)), id="islands-k8-all"),
    pytest.param(ISLANDS, 4, (0,), (), (), [4, 5, 6, 7], id="islands-k4-only-whole-island"),
    pytest.param(ISLANDS, 1, (4,), (), (), [5], id="islands-k1-from-broken-island"),
    pytest.param(ISLANDS, 3, (4,), (), (), [5, 6, 7], id="islands-k3-fills-broken-island"),
    pytest.param(ISLANDS, 2, (1, 2), (), (), [0, 3], id="islands-k2-keeps-whole-island"),
    pytest.param(ISLANDS, 4, (), (2,), (), [4, 5, 6, 7], id="islands-unhealthy-member"),
    pytest.param(ISLANDS, 3, (), (2,), (), [0, 1, 3], id="islands-k3-around-unhealthy"),
    pytest.param(ISLANDS, 2, (), (2,), (2,), [0, 1], id="islands-unhealthy-must-include"),
    pytest.param(ISLANDS, 4, (), (), (5,), [5, 4, 6, 7], id="islands-must-on-second-island"),
    pytest.param(ISLANDS, 4, (), (), (0, 5), [0, 5, 1, 2], id="islands-must-on-both-islands"),
    pytest.param(ISLANDS, 1, (), (), (6,), [6], id="islands-must-fills-request"),
    pytest.param(DGX1, 1, (), (), (), [0], id="dgx1-k1"),
    pytest.param(DGX1, 2, (), (), (), [2, 3], id="dgx1-k2-double-link-on-switch"),
    pytest.param(DGX1, 3, (), (), (), [0, 2, 3], id="dgx1-k3"),
    pytest.param(DGX1, 4, (), (), (), [0, 1, 2, 3], id="dgx1-k4-fully-connected-half"),
    pytest.param(DGX1, 5, (), (), (), [0, 1, 2, 3, 4], id="dgx1-k5"),
    pytest.param(DGX1, 8, (), (), (), list(range(8)), id="dgx1-k8"),
    pytest.param(DGX1, 2, (), (), (5,), [5, 6], id="dgx1-must-best-partner"),
    pytest.param(DGX1, 4, (0,), (), (), [4, 5, 6, 7], id="dgx1-k4-other-half"),
    pytest.param(PCIE_NUMA, 4, (), (), (), [0, 1, 2, 3], id="pcie-k4-one-numa-node"),
    pytest.param(PCIE_NUMA, 3, (0, 1), (), (), [4, 5, 6], id="pcie-k3-stays-in-node"),
    pytest.param(PCIE_NUMA, 2, (0, 1), (), (), [2, 3], id="pcie-k2-switch-pair-broken-node"),
    pytest.param(SWITCH_ACROSS, 3, (), (), (), [0, 1, 2], id="pcie-numa-beats-remote-switch"),
    pytest.param(NUMA_ONLY, 4, (), (), (), [0, 2, 4, 6], id="numa-only-k4"),
    pytest.param(NUMA_ONLY, 2, (0,), (), (), [2, 4], id="numa-only-k2"),
    pytest.param(SKEWED, 2, (), (), (), [1, 2], id="skewed-k2-most-links"),
    pytest.param(SKEWED, 3, (), (), (), [1, 2, 3], id="skewed-k3"),
    pytest.param(ISLANDS, 4, (0, 2, 3, 4, 5, 7), (), (), [1, 6], id="fewer-available-than-size"),
]


@pytest.mark.parametrize(
    ("inventory", "size", "taken", "unhealthy", "must", "expected"), WHOLE_CASES
)
def test_whole_gpus(
    inventory: Inventory,
    size: int,
    taken: tuple[int, ...],
    unhealthy: tuple[int, ...],
    must: tuple[int, ...],
    expected: list[int],
) -> None:
    assert choose(inventory, size, taken, unhealthy, must) == expected


@pytest.mark.parametrize(
    ("link", "numa", "score"),
    [
        pytest.param(Link(), (None, None), 10, id="unknown"),
        pytest.param(Link(), (0, 1), 10, id="across-numa"),
        pytest.param(Link(), (1, 1), 20, id="numa-only"),
        pytest.param(Link(pcie=PcieLevel.NODE), (None, None), 20, id="same-node"),
        pytest.param(Link(pcie=PcieLevel.HOSTBRIDGE), (0, 0), 30, id="host-bridge"),
        pytest.param(Link(pcie=PcieLevel.MULTIPLE), (0, 0), 40, id="switches"),
        pytest.param(Link(pcie=PcieLevel.SINGLE), (0, 1), 50, id="switch-beats-numa-data"),
        pytest.param(Link(pcie=PcieLevel.INTERNAL), (None, None), 60, id="board"),
        pytest.param(Link(nvlinks=1), (0, 1), 110, id="one-nvlink-beats-any-pcie"),
        pytest.param(Link(nvlinks=12, pcie=PcieLevel.NODE), (-1, -1), 1220, id="nvswitch"),
    ],
)
def test_pair_score(link: Link, numa: tuple[int | None, int | None], score: int) -> None:
    assert pair_score(link, *numa) == score


# --- MIG: four GPUs with seven 1g devices each ------------------------------------------------

MIG_NODE = node([0, 0, 1, 1])
MIGS = [mig_device(g, j) for g in range(4) for j in range(7)]


def mig_ids(*pairs: tuple[int, int]) -> list[str]:
    return [f"MIG-{g}-{j}" for g, j in pairs]


def on(gpu: int, *indices: int) -> list[str]:
    return mig_ids(*((gpu, j) for j in indices))


MIG_CASES = [
    pytest.param([], [], [], 3, on(0, 0, 1, 2), id="all-free-lowest-parent"),
    pytest.param(on(1, 0, 1), [], [], 3, on(1, 2, 3, 4), id="most-used-parent"),
    pytest.param(
        on(1, 0, 1, 2, 3, 4, 5) + on(2, 0, 1),
        [],
        [],
        3,
        on(2, 2, 3, 4),
        id="most-used-parent-that-fits",
    ),
    pytest.param(on(0, 0, 1, 2, 3, 4) + on(3, 0), [], [], 2, on(0, 5, 6), id="fills-parent"),
    pytest.param([], [], [], 9, on(0, *range(7)) + on(1, 0, 1), id="two-parents"),
    pytest.param(
        on(2, 0, 1, 2), [], [], 9, on(0, *range(7)) + on(2, 3, 4), id="two-parents-second-most-used"
    ),
    pytest.param([], on(3, 4), [], 3, on(3, 4, 0, 1), id="must-parent-first"),
    pytest.param(
        on(3, 0, 1, 2, 3, 4),
        on(3, 5),
        [],
        4,
        on(3, 5, 6) + on(0, 0, 1),
        id="must-parent-then-fewest-parents",
    ),
    pytest.param(on(0, 0), [], on(0, 1, 2), 3, on(0, 3, 4, 5), id="unhealthy-skipped"),
    pytest.param(
        on(0, *range(6)) + on(1, *range(5)) + on(2, *range(7)) + on(3, *range(6)),
        [],
        [],
        3,
        on(1, 5, 6) + on(0, 6),
        id="no-parent-fits-largest-first",
    ),
]


@pytest.mark.parametrize(("taken", "must", "unhealthy", "size", "expected"), MIG_CASES)
def test_mig_packing(
    taken: list[str], must: list[str], unhealthy: list[str], size: int, expected: list[str]
) -> None:
    available = sorted({d.id for d in MIGS} - set(taken), reverse=True)
    answer = preferred_allocation(resource(MIGS, unhealthy), MIG_NODE, available, must, size)
    assert answer == expected


# --- replicas: four GPUs with four replicas each ----------------------------------------------

REPLICA_NODE = node([0, 0, 1, 1])
REPLICAS = replicated([gpu_device(g) for g in range(4)], 4)


def rep(*pairs: tuple[int, int]) -> list[str]:
    return [f"GPU-{g}::{n}" for g, n in pairs]


REPLICA_CASES = [
    pytest.param("distributed", [], [], 4, rep((0, 0), (1, 0), (2, 0), (3, 0)), id="one-per-gpu"),
    pytest.param(
        "distributed", rep((0, 0), (0, 1)), [], 3, rep((1, 0), (2, 0), (3, 0)), id="least-used-gpus"
    ),
    pytest.param(
        "distributed",
        [],
        [],
        6,
        rep((0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1)),
        id="second-round",
    ),
    pytest.param(
        "distributed",
        rep((1, 0), (2, 0), (3, 0)),
        [],
        2,
        rep((0, 0), (1, 1)),
        id="picked-in-call-breaks-tie",
    ),
    pytest.param("distributed", [], rep((0, 3)), 2, rep((0, 3), (1, 0)), id="must-counts-as-used"),
    pytest.param("packed", rep((2, 0)), [], 3, rep((2, 1), (2, 2), (2, 3)), id="packed-most-used"),
    pytest.param(
        "packed",
        rep((2, 0)),
        [],
        6,
        rep((2, 1), (2, 2), (2, 3), (0, 0), (0, 1), (0, 2)),
        id="packed-overflow-lowest-index",
    ),
    pytest.param("packed", [], rep((3, 1)), 2, rep((3, 1), (3, 0)), id="packed-next-to-must"),
]


@pytest.mark.parametrize(("policy", "taken", "must", "size", "expected"), REPLICA_CASES)
def test_replicas(
    policy: topology.Policy, taken: list[str], must: list[str], size: int, expected: list[str]
) -> None:
    available = sorted({d.id for d in REPLICAS} - set(taken), reverse=True)
    shared = resource(REPLICAS, replicas=4)
    answer = preferred_allocation(shared, REPLICA_NODE, available, must, size, policy)
    assert answer == expected


def test_replicated_mig_spreads_over_mig_devices() -> None:
    devices = replicated([mig_device(0, 0), mig_device(0, 1), mig_device(1, 0)], 2)
    shared = resource(devices, replicas=2)
    answer = preferred_allocation(shared, MIG_NODE, [d.id for d in devices], [], 3)
    assert answer == ["MIG-0-0::0", "MIG-0-1::0", "MIG-1-0::0"]


# --- safety and fallback ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, -1])
def test_no_devices_for_empty_request(size: int) -> None:
    assert choose(ISLANDS, size) == []


def test_unknown_duplicate_and_unavailable_ids_are_ignored() -> None:
    available = ["GPU-5", "nope", "GPU-4", "GPU-5", "MIG-0-0"]
    answer = preferred_allocation(whole(ISLANDS), ISLANDS, available, ["GPU-0", "ghost"], 2)
    assert answer == ["GPU-4", "GPU-5"]


def test_must_include_beyond_size_is_kept_whole() -> None:
    assert choose(ISLANDS, 1, must=(3, 1)) == [1, 3]


@contextmanager
def warnings_logged() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Recorder(logging.WARNING)
    logger = logging.getLogger("deviceplugin.model.topology")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def broken(*args: object, **kwargs: object) -> list[int]:
    raise RuntimeError("boom")


@pytest.mark.parametrize("target", ["choose_gpus", "build_index"])
def test_internal_error_falls_back_to_sorted_choice(
    monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    monkeypatch.setattr(topology, target, broken)
    with warnings_logged() as records:
        answer = preferred_allocation(
            whole(ISLANDS, unhealthy=[1]),
            ISLANDS,
            ["GPU-7", "GPU-1", "GPU-5", "GPU-2", "GPU-0"],
            ["GPU-7"],
            3,
        )
    assert answer == ["GPU-7", "GPU-0", "GPU-2"]
    assert [r.getMessage() for r in records] == ["preferred.fallback"]


def test_unknown_policy_falls_back() -> None:
    shared = resource(REPLICAS, replicas=4)
    with warnings_logged() as records:
        answer = preferred_allocation(shared, REPLICA_NODE, ["GPU-3::0", "GPU-0::1"], [], 1, "x")  # type: ignore[arg-type]
    assert answer == ["GPU-0::1"]
    assert len(records) == 1


def test_index_is_built_once_per_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[ResourceSet] = []

    def counting(resource: ResourceSet, inventory: Inventory) -> topology.TopologyIndex:
        built.append(resource)
        return build_index(resource, inventory)

    monkeypatch.setattr(topology, "build_index", counting)
    first, second = whole(ISLANDS), whole(ISLANDS)
    for current in (first, first, second, first):
        preferred_allocation(current, ISLANDS, ["GPU-0", "GPU-1"], [], 1)
    assert [id(r) for r in built] == [id(first), id(second)]


def test_index_answers_like_the_cached_call() -> None:
    index = build_index(whole(DGX1), DGX1)
    ids = [f"GPU-{i}" for i in range(8)]
    assert index.preferred(ids, [], 3) == preferred_allocation(whole(DGX1), DGX1, ids, [], 3)
    assert index.kind == "gpus"


# --- beyond the exact limit -------------------------------------------------------------------

THREE_ISLANDS = node(
    [0] * 8 + [1] * 8 + [2] * 8,
    island_links([range(0, 8), range(8, 16), range(16, 24)], Link(nvlinks=12, pcie=PcieLevel.NODE)),
)


@pytest.mark.parametrize(
    ("size", "taken", "expected"),
    [
        pytest.param(8, (), list(range(8)), id="k8-first-island"),
        pytest.param(8, (0,), list(range(8, 16)), id="k8-next-whole-island"),
        pytest.param(4, (0,), [1, 2, 3, 4], id="k4-broken-island"),
        pytest.param(12, (), list(range(12)), id="k12-island-and-half-the-next"),
    ],
)
def test_heuristic_on_24_gpus(size: int, taken: tuple[int, ...], expected: list[int]) -> None:
    assert choose(THREE_ISLANDS, size, taken) == expected


@pytest.mark.parametrize("inventory", [ISLANDS, DGX1, PCIE_NUMA, SKEWED])
def test_heuristic_matches_exact_on_small_nodes(inventory: Inventory) -> None:
    scores = build_index(whole(inventory), inventory).scores
    count = len(scores)
    for size in range(1, count):
        exact = choose_gpus(scores, [], list(range(count)), size)
        assert choose_gpus(scores, [], list(range(count)), size, exact_limit=0) == exact, size


# --- properties -------------------------------------------------------------------------------


def reference_rank(
    scores: Sequence[Sequence[int]],
    must: Sequence[int],
    candidates: Sequence[int],
    chosen: Sequence[int],
) -> tuple[int, int, int]:
    """(weakest pair, pair sum, -pull of the chosen to the whole pool), from scratch."""
    members = [*must, *chosen]
    pairs = [scores[a][b] for a, b in combinations(members, 2)]
    pool = [*must, *candidates]
    pull = sum(scores[c][x] for c in chosen for x in pool if x != c)
    return (min(pairs, default=1 << 40), sum(pairs), -pull)


def brute_force(
    scores: Sequence[Sequence[int]], must: list[int], candidates: list[int], size: int
) -> list[int]:
    """Every combination ranked as gpuset promises; ties to the smallest index tuple."""
    best = max(
        combinations(candidates, size),
        key=lambda combo: (reference_rank(scores, must, candidates, combo), [-i for i in combo]),
    )
    return list(best)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), count=st.integers(2, 9))
def test_exact_search_finds_the_best_set(data: st.DataObject, count: int) -> None:
    values = st.sampled_from([10, 20, 30, 40, 50, 60, 110, 120, 150, 220, 410, 1220])
    scores = [[0] * count for _ in range(count)]
    for a, b in combinations(range(count), 2):
        scores[a][b] = scores[b][a] = data.draw(values)
    must = sorted(data.draw(st.sets(st.integers(0, count - 1), max_size=count - 1)))
    candidates = [i for i in range(count) if i not in must]
    size = data.draw(st.integers(1, len(candidates)))
    assert choose_gpus(scores, must, candidates, size) == brute_force(
        scores, must, candidates, size
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ResourceSet, Inventory, list[str], list[str], int, str]:
    count = draw(st.integers(1, 12))
    numa = draw(st.lists(st.sampled_from([None, 0, 1]), min_size=count, max_size=count))
    pairs = draw(
        st.sets(st.sampled_from(list(combinations(range(count), 2))) if count > 1 else st.nothing())
    )
    links = {
        pair: Link(nvlinks=draw(st.integers(0, 6)), pcie=draw(st.sampled_from(list(PcieLevel))))
        for pair in sorted(pairs)
    }
    inventory = node(numa, links)
    kind = draw(st.sampled_from(["gpus", "mig", "replicas"]))
    gpus = [gpu_device(i, n) for i, n in enumerate(numa)]
    devices: list[Device]
    if kind == "gpus":
        devices = gpus
    elif kind == "mig":
        devices = [mig_device(i, j) for i in range(count) for j in range(draw(st.integers(1, 3)))]
    else:
        devices = replicated(gpus, draw(st.integers(1, 3)))
    ids = [d.id for d in devices]
    unhealthy = draw(st.sets(st.sampled_from(ids)))
    offered = draw(st.lists(st.sampled_from([*ids, "GPU-99", "MIG-x"]), unique=True))
    must = draw(st.lists(st.sampled_from(offered), unique=True)) if offered else []
    size = draw(st.integers(-1, len(ids) + 2))
    policy = draw(st.sampled_from(["distributed", "packed"]))
    return resource(devices, unhealthy), inventory, offered, must, size, policy


@settings(max_examples=300, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2**32))
def test_answers_are_valid_and_order_independent(
    scenario: tuple[ResourceSet, Inventory, list[str], list[str], int, topology.Policy], seed: int
) -> None:
    resource_set, inventory, offered, must, size, policy = scenario
    with warnings_logged() as records:
        answer = preferred_allocation(resource_set, inventory, offered, must, size, policy)
        shuffled, shuffled_must = list(offered), list(must)
        random.Random(seed).shuffle(shuffled)
        random.Random(seed + 1).shuffle(shuffled_must)
        again = preferred_allocation(resource_set, inventory, shuffled, shuffled_must, size, policy)
    assert records == []
    assert again == answer
    healthy = {d.id for d in resource_set.devices if d.healthy}
    pool = healthy & set(offered)
    kept = sorted(pool & set(must))
    assert len(set(answer)) == len(answer)
    assert set(answer) <= pool
    if size <= 0:
        assert answer == []
        return
    assert sorted(answer[: len(kept)]) == kept
    assert len(answer) == max(min(size, len(pool)), len(kept))


def test_exact_search_prefers_lowest_indices_over_the_greedy_incumbent() -> None:
    """Greedy growth finds an optimal set here that is not the lowest one; the exact search
    must still return the lowest."""
    a, b, c = 20, 50, 1220
    scores = [
        [0, a, b, b, a, c, c],
        [a, 0, c, c, a, c, b],
        [b, c, 0, c, a, b, a],
        [b, c, c, 0, b, a, c],
        [a, a, a, b, 0, b, c],
        [c, c, b, a, b, 0, c],
        [c, b, a, c, c, c, 0],
    ]
    everyone = list(range(7))
    tie = reference_rank(scores, [], everyone, [1, 2, 3, 5, 6])
    assert tie == reference_rank(scores, [], everyone, [0, 1, 3, 5, 6])
    assert choose_gpus(scores, [], list(range(7)), 5) == [0, 1, 3, 5, 6]
