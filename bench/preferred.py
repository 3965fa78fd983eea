"""Preferred allocation of 8 on the largest nodes we expect: 16 GPUs x 7 MIG devices x 16 replicas
(1,792 IDs) and 16 whole GPUs (NVSwitch, two NVLink islands).

Absolute times vary with the machine, so every case also times a fixed yardstick in the same
loop, sorting 1,792 shuffled device IDs (about the least any answer on the big node must do: look
at every ID), and reports the ratio, which travels between machines better than milliseconds.
`python -m bench.preferred` prints the table; `run()` returns the figures.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from bench import report
from deviceplugin.model.devices import Device, Gpu, Inventory, Link, MigDevice, PcieLevel
from deviceplugin.model.resources import ResourceSet
from deviceplugin.model.topology import Policy, preferred_allocation

CALLS = 200
SIZE = 8
GPUS = 16


@dataclass(frozen=True)
class Case:
    name: str
    resource: ResourceSet
    inventory: Inventory
    available: list[str]
    policy: Policy = "distributed"


def _inventory(links: dict[tuple[int, int], Link]) -> Inventory:
    gpus = tuple(
        Gpu(i, f"GPU-{i:02d}", "H100", 81559, i, f"0000:{i:02x}:00.0", i // 8) for i in range(GPUS)
    )
    return Inventory(gpus=gpus, links=links)


def _gpu(index: int) -> Device:
    uuid = f"GPU-{index:02d}"
    return Device(uuid, uuid, uuid, index, index, index // 8)


def _whole(name: str, links: dict[tuple[int, int], Link], taken: Sequence[int]) -> Case:
    devices = tuple(_gpu(i) for i in range(GPUS))
    available = [d.id for d in devices if d.gpu_index not in taken]
    random.Random(name).shuffle(available)
    resource = ResourceSet("nvidia.com/gpu", devices)
    return Case(name, resource, _inventory(links), available)


def _links(nvlinks_within: int, nvlinks_across: int) -> dict[tuple[int, int], Link]:
    """Two halves of eight, one NUMA node each."""
    links = {}
    for a, b in combinations(range(GPUS), 2):
        same = a // 8 == b // 8
        pcie = PcieLevel.NODE if same else PcieLevel.SYSTEM
        links[(a, b)] = Link(nvlinks_within if same else nvlinks_across, pcie)
    return links


def _replicated_mig(policy: Policy) -> Case:
    devices: list[Device] = []
    for gpu in range(GPUS):
        parent = _gpu(gpu)
        for index in range(7):
            uuid = f"MIG-{gpu:02d}-{index}"
            mig = MigDevice(uuid, index, index + 7, 0, "1g.10gb", 9856, 1, 1)
            device = replace(parent, id=uuid, physical_uuid=uuid, mig=mig)
            devices.extend(replace(device, id=f"{uuid}::{n}", replica=n) for n in range(16))
    rng = random.Random(policy)
    available = [d.id for d in devices if rng.random() >= 0.25]
    rng.shuffle(available)
    resource = ResourceSet("nvidia.com/mig-1g.10gb", tuple(devices), replicas=16)
    return Case(f"replicated-mig-1792-{policy}", resource, _inventory({}), available, policy)


def cases() -> list[Case]:
    return [
        _replicated_mig("distributed"),
        _replicated_mig("packed"),
        _whole("nvswitch-16", _links(18, 18), ()),
        _whole("two-islands-16", _links(12, 0), ()),
        _whole("two-islands-16-fragmented", _links(12, 0), (0, 9, 10)),
    ]


def _measure(case: Case, yardstick: list[str]) -> dict[str, float]:
    started = time.perf_counter_ns()
    preferred_allocation(case.resource, case.inventory, case.available, [], SIZE, case.policy)
    first = time.perf_counter_ns() - started
    calls, baseline = [], []
    for _ in range(CALLS):
        started = time.perf_counter_ns()
        preferred_allocation(case.resource, case.inventory, case.available, [], SIZE, case.policy)
        middle = time.perf_counter_ns()
        sorted(yardstick)
        baseline.append(time.perf_counter_ns() - middle)
        calls.append(middle - started)
    median = report.median(calls)
    base = report.median(baseline)
    return {
        "ids": len(case.resource.devices),
        "available": len(case.available),
        "first_call_ms": first / 1e6,
        "median_ms": median / 1e6,
        "p99_ms": report.p99(calls) / 1e6,
        "baseline_median_ms": base / 1e6,
        "ratio": median / base if base else 0.0,
    }


def run() -> dict[str, dict[str, float]]:
    """Figures per case: median and p99 of CALLS preferred allocations of SIZE, the first call
    (which builds the index), and the yardstick's median in the same loop with the ratio."""
    all_cases = cases()
    yardstick = [d.id for d in all_cases[0].resource.devices]
    random.Random(0).shuffle(yardstick)
    return {case.name: _measure(case, yardstick) for case in all_cases}


def format_table(results: dict[str, dict[str, float]]) -> str:
    lines = [
        f"{'case':<34}{'ids':>6}{'first ms':>10}{'median ms':>11}{'p99 ms':>9}"
        f"{'sort ms':>9}{'ratio':>7}"
    ]
    for name, row in results.items():
        lines.append(
            f"{name:<34}{row['ids']:>6.0f}{row['first_call_ms']:>10.2f}{row['median_ms']:>11.3f}"
            f"{row['p99_ms']:>9.3f}{row['baseline_median_ms']:>9.3f}{row['ratio']:>7.1f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(run()))
