"""Preferred allocation: which of the kubelet's available IDs a container should get.

Whole GPUs are chosen by link strength (`gpuset.py`), MIG devices and replicas by packing
(`packing.py`). The answer is a pure function of (available, must-include, size, health,
topology): input order never matters, and it never names an unhealthy, unknown or unavailable ID
or one twice. The kubelet
treats the answer as advice but fails admission on an RPC error, so an internal error degrades to
a simple deterministic choice and a `preferred.fallback` warning instead of raising.

Pair score of two GPUs: 100 per NVLink plus 60 minus their PCIe level (same board 60, one
switch 50, several switches 40, host bridge 30, same NUMA node 20, across nodes 10), so one NVLink
outweighs any PCIe relation. A shared known NUMA node counts as at least NODE, so pairs whose
PCIe relation discovery could not read (SYSTEM by default) still rank same-node above cross-node.

Use: `build_index(resource, inventory)` once per resource update, then `index.preferred(...)` on
each GetPreferredAllocation; `preferred_allocation(...)` does both through a small cache keyed by
the identity of the (resource, inventory) pair, which `index_for` fills ahead of the first call.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal

from deviceplugin.model.devices import Device, Inventory, Link, PcieLevel
from deviceplugin.model.gpuset import choose_gpus
from deviceplugin.model.log import log_event
from deviceplugin.model.packing import pack_mig, spread_replicas
from deviceplugin.model.record import record
from deviceplugin.model.resources import ResourceSet

Policy = Literal["distributed", "packed"]
Kind = Literal["gpus", "mig", "replicas"]

NVLINK_WEIGHT = 100  # one NVLink outweighs the closest PCIe relation (60)
_CACHE_SIZE = 64

_log = logging.getLogger(__name__)


def pair_score(link: Link, numa_a: int | None, numa_b: int | None) -> int:
    """How well two GPUs talk; see the module docstring for the scale."""
    level = min(max(int(link.pcie), PcieLevel.INTERNAL), PcieLevel.SYSTEM)
    if numa_a is not None and numa_a >= 0 and numa_a == numa_b:
        level = min(level, PcieLevel.NODE)
    return NVLINK_WEIGHT * max(link.nvlinks, 0) + PcieLevel.SYSTEM + 10 - level


@record(frozen=True)
class TopologyIndex:
    """What each preferred allocation for one resource needs, computed once per resource update,
    so a call costs a pass over `available` plus the choice itself.

    A slot is a device's position in (GPU index, MIG index, replica) order; a group is the parent
    GPU (MIG) or the physical device (replicas), numbered in the same order.
    """

    resource: ResourceSet
    kind: Kind
    ids: tuple[str, ...]
    slots: Mapping[str, int]
    healthy: tuple[bool, ...]
    groups: tuple[int, ...]
    group_sizes: tuple[int, ...]
    scores: tuple[tuple[int, ...], ...]  # slot x slot pair scores; whole GPUs only

    def preferred(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        policy: Policy = "distributed",
    ) -> list[str]:
        """Must-include IDs (healthy, available) first, then the chosen ones; `policy` applies to
        replicas. Returns fewer than `size` only when fewer healthy available IDs exist, and
        more only when must_include alone exceeds `size`."""
        if size <= 0:
            return []
        try:
            return self._choose(available, must_include, size, policy)
        except Exception as error:
            return fallback(self.resource, available, must_include, size, error)

    def _choose(
        self, available: Sequence[str], must_include: Sequence[str], size: int, policy: str
    ) -> list[str]:
        if policy not in ("distributed", "packed"):
            raise ValueError(f"unknown policy {policy!r}")
        offered = {slot for slot in map(self.slots.get, available) if slot is not None}
        must = sorted(
            {s for s in map(self.slots.get, must_include) if s in offered and self.healthy[s]}
        )
        taken = set(must)
        candidates = sorted(s for s in offered if self.healthy[s] and s not in taken)
        needed = size - len(must)
        if needed <= 0 or len(candidates) <= needed:
            picks = candidates[: max(needed, 0)]
        elif self.kind == "gpus":
            picks = choose_gpus(self.scores, must, candidates, needed)
        else:
            free: dict[int, list[int]] = {}
            for slot in candidates:
                free.setdefault(self.groups[slot], []).append(slot)
            offered_in = Counter(self.groups[slot] for slot in offered)
            used = {group: self.group_sizes[group] - offered_in[group] for group in free}
            must_groups = Counter(self.groups[slot] for slot in must)
            if self.kind == "mig":
                picks = pack_mig(free, used, must_groups, needed)
            else:
                picks = spread_replicas(free, used, must_groups, needed, policy == "packed")
        return [self.ids[slot] for slot in must + picks]


def build_index(resource: ResourceSet, inventory: Inventory) -> TopologyIndex:
    """Index a resource: replicas if any device is a replica, whole GPUs if none is a MIG device,
    MIG otherwise (a GPU sharing a resource with MIG devices is its own parent)."""
    devices: dict[str, Device] = {}
    for device in sorted(resource.devices, key=_order):
        devices.setdefault(device.id, device)
    ordered = list(devices.values())
    kind: Kind
    if any(device.replica is not None for device in ordered):
        kind = "replicas"
    elif all(device.mig is None for device in ordered):
        kind = "gpus"
    else:
        kind = "mig"
    numbers: dict[str, int] = {}
    groups = tuple(
        numbers.setdefault(d.physical_uuid if kind == "replicas" else d.gpu_uuid, len(numbers))
        for d in ordered
    )
    sizes = Counter(groups)
    return TopologyIndex(
        resource=resource,
        kind=kind,
        ids=tuple(devices),
        slots={device_id: slot for slot, device_id in enumerate(devices)},
        healthy=tuple(device.healthy for device in ordered),
        groups=groups,
        group_sizes=tuple(sizes[group] for group in range(len(numbers))),
        scores=_score_matrix(ordered, inventory) if kind == "gpus" else (),
    )


def _score_matrix(gpus: Sequence[Device], inventory: Inventory) -> tuple[tuple[int, ...], ...]:
    def score(a: Device, b: Device) -> int:
        if a is b:
            return 0
        return pair_score(inventory.link(a.gpu_index, b.gpu_index), a.numa_node, b.numa_node)

    return tuple(tuple(score(a, b) for b in gpus) for a in gpus)


def preferred_allocation(
    resource: ResourceSet,
    inventory: Inventory,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: Policy = "distributed",
) -> list[str]:
    """GetPreferredAllocation for one container; indexes the resource on first use."""
    if size <= 0:
        return []
    try:
        index = index_for(resource, inventory)
    except Exception as error:
        return fallback(resource, available, must_include, size, error)
    return index.preferred(available, must_include, size, policy)


_indexes: dict[tuple[int, int], tuple[ResourceSet, Inventory, TopologyIndex]] = {}


def index_for(resource: ResourceSet, inventory: Inventory) -> TopologyIndex:
    """build_index memoised on argument identity: resource sets and inventories are frozen and
    replaced on every change, so identity marks a change exactly and costs nothing to check
    (hashing 1,792 devices would cost more than the allocation). The entry holds the arguments,
    so their ids cannot be reused while cached."""
    key = (id(resource), id(inventory))
    entry = _indexes.get(key)
    if entry is None:
        entry = (resource, inventory, build_index(resource, inventory))
        if len(_indexes) >= _CACHE_SIZE:
            del _indexes[next(iter(_indexes))]
        _indexes[key] = entry
    return entry[2]


def fallback(
    resource: ResourceSet,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    error: Exception,
) -> list[str]:
    """The simple choice after an internal error: healthy must-include IDs, then the other
    healthy available IDs in sorted order."""
    log_event(
        _log,
        "preferred.fallback",
        logging.WARNING,
        resource=resource.name,
        size=size,
        error=repr(error),
    )
    healthy = {device.id for device in resource.devices if device.healthy}
    offered = healthy.intersection(available)
    must = sorted(offered.intersection(must_include))
    rest = sorted(offered.difference(must))
    return must + rest[: max(size - len(must), 0)]


def _order(device: Device) -> tuple[int, int, int, str]:
    mig = device.mig.index if device.mig is not None else -1
    replica = device.replica if device.replica is not None else -1
    return (device.gpu_index, mig, replica, device.id)
