"""Publishing the slices of 8 A100s in dynamic MIG mode (`dra serve --mig-mode dynamic`,
issue 42: <= 100 ms), against the static mode's publish of 8 A100s taken in the same run.

Dynamic: preset a100-80gb-x8-dynamic (MIG on, no instance), each GPU published whole and as its
25 profile x placement partitions, 208 devices with counters plus 8 counter sets: five slices
(one of counter sets, four of at most 64 devices). Static (the baseline): preset
a100-80gb-x8-mixed as the project ships it, 28 MIG devices and 4 whole GPUs in one slice. Both
through the real publisher and async Kubernetes client to the API-server stand-in over HTTP on
127.0.0.1; the inventory is discovered once beforehand, so the figure is building, diffing and
writing. Two measures: the first publish (list, then creates) and a publish after a health
change (an Xid on GPU 0: every slice replaced with the next generation).

The stand-in checks every body against the OpenAPI schema in Python (kubernetes-validate),
which for 208 devices costs far more than the whole publish: a real API server validates in Go.
So the two target figures are taken with that check off (the 1.37 slice rules it lacks, such as
the counter limits, still apply), and a third figure gives the first publish with it on, the
stand-in as the tests run it, against the first.
`python -m bench.dynamicmig` prints the figures; `run(root)` returns them.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bench.report import Figure, median
from deviceplugin.dra.kubeapi import connect
from deviceplugin.dra.publisher import SlicePublisher
from deviceplugin.model.devices import Inventory
from deviceplugin.node.discovery import discover
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.simulator import NodeSimulator

DYNAMIC_PRESET = "a100-80gb-x8-dynamic"
STATIC_PRESET = "a100-80gb-x8-mixed"
REPEATS = 9
TARGET_S = 0.1
NODE = "bench-node"


def discover_preset(preset: str, dynamic: bool) -> Inventory:
    nvml = NodeSimulator(preset).open_nvml(None)
    nvml.init()
    try:
        return discover(nvml, mig_profiles=dynamic)
    finally:
        nvml.shutdown()


async def _publishes(
    inventory: Inventory, dynamic: bool, slices: int, openapi: bool = False
) -> tuple[float, float]:
    """(first publish, publish after an Xid on GPU 0) in seconds, on a fresh stand-in
    (`openapi`: checking bodies against the OpenAPI schema)."""
    server = ApiServer(openapi=openapi)
    await server.start()
    publisher = SlicePublisher(connect(server=server.url), NODE, dynamic_mig=dynamic)
    try:
        started = time.perf_counter()
        if not await publisher.publish(inventory, {}):
            raise RuntimeError("first publish failed")
        first = time.perf_counter() - started
        sick = {inventory.gpus[0].uuid: "xid-79"}
        started = time.perf_counter()
        if not await publisher.publish(inventory, sick):
            raise RuntimeError("publish after the Xid failed")
        change = time.perf_counter() - started
        if len(server.slices) != slices or server.rejected:
            raise RuntimeError(f"stand-in holds {len(server.slices)} slices: {server.rejected}")
        return first, change
    finally:
        await publisher.close()
        await server.stop()


async def run(root: Path) -> list[Figure]:
    """Medians of the dynamic publishes, each against the static one of the same run."""
    dynamic = discover_preset(DYNAMIC_PRESET, True)
    static = discover_preset(STATIC_PRESET, False)
    ours: list[tuple[float, float]] = []
    base: list[tuple[float, float]] = []
    checked: list[float] = []
    for _ in range(REPEATS):
        ours.append(await _publishes(dynamic, True, 5))
        base.append(await _publishes(static, False, 1))
        checked.append((await _publishes(dynamic, True, 5, openapi=True))[0])
    label = f"static mode's publish of {STATIC_PRESET} (32 devices, 1 slice)"
    figures = []
    for n, what in enumerate(("first publish", "publish after an Xid (5 replaces)")):
        samples = [pair[n] for pair in ours]
        figures.append(
            Figure(
                f"DRA dynamic MIG, 8 A100 (208 devices + 8 counter sets), {what}, median",
                median(samples),
                "s",
                target=TARGET_S,
                baseline=median(pair[n] for pair in base),
                baseline_label=label,
                samples=samples,
            )
        )
    figures.append(
        Figure(
            "DRA dynamic MIG, 8 A100, first publish to the stand-in checking the OpenAPI "
            "schema (as the tests run it), median",
            median(checked),
            "s",
            baseline=figures[0].value,
            baseline_label="the dynamic first publish without that check",
            samples=checked,
        )
    )
    return figures


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="dpb-dmig") as root:
        for figure in asyncio.run(run(Path(root))):
            value, baseline = figure.value or 0.0, figure.baseline or 0.0
            ratio = value / baseline if baseline else 0.0
            print(
                f"{figure.measure}: {value:.4f} {figure.unit} (baseline {baseline:.4f}"
                f" {figure.unit}, {ratio:.2f}x) {figure.result}"
            )


if __name__ == "__main__":
    main()
