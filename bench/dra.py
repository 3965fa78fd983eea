"""Publishing ResourceSlices for the largest DRA node we plan for: 64 A100s cut into seven
1g.10gb MIG devices each (448 devices, four slices), through the real async Kubernetes client
to the API-server stand-in over HTTP on 127.0.0.1, which validates every slice it receives.

Two measures over HTTP, each against a baseline taken in the same run: the first publish (list, then
four creates) and a publish after a health change (four replaces with the next generation;
the health flips back and forth). The baseline sends the same four slices, already serialised,
as plain POSTs from one aiohttp session to a fresh stand-in: transport and the stand-in's
validation without our building, diffing and client, so the ratio is what the publisher adds.
A third, pure figure: building the devices and slices from the plan, next to serialising them.
`python -m bench.dra` prints the figures; `run(root)` returns them.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from bench.report import Figure, median, p99
from deviceplugin.dra.kubeapi import connect
from deviceplugin.dra.publisher import SlicePublisher
from deviceplugin.host import open_nvml
from deviceplugin.model.config import load_config
from deviceplugin.model.devices import Inventory
from deviceplugin.model.resources import ResourceSet, apply_health, build_plan
from deviceplugin.model.slices import build_devices, build_slices
from deviceplugin.node.discovery import discover
from deviceplugin.sim.apiserver import PREFIX, ApiServer

GPUS = 64
GI_IDS = (7, 8, 9, 11, 12, 13, 14)
REPEATS = 7
CHANGES = 20
TARGET_S = 1.0
NODE = "bench-node"


def write_node(path: Path) -> Path:
    """The node file: 64 A100-80GB, eight per NUMA node, all MIG 7 x 1g.10gb."""
    gpus = [
        {
            "uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000",
            "name": "NVIDIA A100-SXM4-80GB",
            "memoryMiB": 81920,
            "pciBusId": f"0000{i // 32:04X}:{0x10 + i % 32:02X}:00.0",
            "index": i,
            "numaNode": i // 8,
            "computeCapability": "8.0",
            "migCapable": True,
            "migEnabled": True,
            "migDevices": [
                {
                    "profile": "1g.10gb",
                    "uuid": f"MIG-{i:08x}-{n:04x}-4000-8000-000000000000",
                    "gpuInstanceId": gi,
                }
                for n, gi in enumerate(GI_IDS)
            ],
        }
        for i in range(GPUS)
    ]
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return path


def discover_node(path: Path) -> tuple[Inventory, dict[str, ResourceSet]]:
    nvml = open_nvml(str(path))
    nvml.init()
    try:
        inventory = discover(nvml)
    finally:
        nvml.shutdown()
    config = load_config(None, {"mig_strategy": "mixed"}, {}).config
    return inventory, dict(build_plan(inventory, config).resources)


async def _baseline(bodies: list[bytes]) -> float:
    server = ApiServer()
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            started = time.perf_counter()
            for body in bodies:
                async with session.post(
                    f"{server.url}{PREFIX}/resourceslices",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as answer:
                    await answer.read()
                    if answer.status != 201:
                        raise RuntimeError(f"baseline POST answered {answer.status}")
            return time.perf_counter() - started
    finally:
        await server.stop()


async def _first_publish(inventory: Inventory, resources: dict[str, ResourceSet]) -> float:
    server = ApiServer()
    await server.start()
    publisher = SlicePublisher(await connect(host=server.url), NODE)
    try:
        started = time.perf_counter()
        if not await publisher.publish(inventory, resources):
            raise RuntimeError("publish failed")
        elapsed = time.perf_counter() - started
        if len(server.slices) != 4 or server.rejected:
            raise RuntimeError(f"stand-in holds {len(server.slices)} slices: {server.rejected}")
        return elapsed
    finally:
        await publisher.close()
        await server.stop()


async def _changes(inventory: Inventory, resources: dict[str, ResourceSet]) -> list[float]:
    server = ApiServer()
    await server.start()
    publisher = SlicePublisher(await connect(host=server.url), NODE)
    sick = apply_health(resources, {inventory.gpus[GPUS // 2].uuid: "xid-79"})
    try:
        await publisher.publish(inventory, resources)
        times = []
        for n in range(CHANGES):
            state = sick if n % 2 == 0 else resources
            started = time.perf_counter()
            if not await publisher.publish(inventory, state):
                raise RuntimeError("publish failed")
            times.append(time.perf_counter() - started)
        if publisher.generation != CHANGES + 1:
            raise RuntimeError(f"generation {publisher.generation}, not {CHANGES + 1}")
        return times
    finally:
        await publisher.close()
        await server.stop()


async def run(root: Path) -> list[Figure]:
    """Median (and p99 for changes) of each measure with its same-run baseline."""
    inventory, resources = discover_node(write_node(root / "dra-node.yaml"))
    devices = build_devices(inventory, resources)
    bodies = [json.dumps(s).encode() for s in build_slices(NODE, devices, 1)]
    first, base = [], []
    for _ in range(REPEATS):
        first.append(await _first_publish(inventory, resources))
        base.append(await _baseline(bodies))
    changes = await _changes(inventory, resources)
    builds, dumps = [], []
    for _ in range(CHANGES):
        started = time.perf_counter()
        built = build_slices(NODE, build_devices(inventory, resources), 2)
        middle = time.perf_counter()
        json.dumps(built)
        dumps.append(time.perf_counter() - middle)
        builds.append(middle - started)
    base_median = median(base)
    label = "4 raw POSTs of the same slices"
    return [
        Figure(
            f"DRA first publish, {len(devices)} devices in 4 slices, median",
            median(first),
            "s",
            target=TARGET_S,
            baseline=base_median,
            baseline_label=label,
            samples=first,
        ),
        Figure(
            "DRA publish after a health change (4 replaces), median",
            median(changes),
            "s",
            target=TARGET_S,
            baseline=base_median,
            baseline_label=label,
            samples=changes,
        ),
        Figure(
            "DRA publish after a health change (4 replaces), p99",
            p99(changes),
            "s",
            target=TARGET_S,
            baseline=base_median,
            baseline_label=label,
        ),
        Figure(
            f"DRA slices built from the plan ({len(devices)} devices, pure), median",
            median(builds) * 1000,
            "ms",
            baseline=median(dumps) * 1000,
            baseline_label="json.dumps of those slices",
            samples=[b * 1000 for b in builds],
        ),
    ]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="dpb-dra") as root:
        for figure in asyncio.run(run(Path(root))):
            ratio = figure.value / figure.baseline if figure.value and figure.baseline else 0.0
            print(
                f"{figure.measure}: {figure.value:.3f} {figure.unit} (baseline "
                f"{figure.baseline:.3f} {figure.unit}, {ratio:.2f}x) {figure.result}"
            )


if __name__ == "__main__":
    main()
