"""Publishing ResourceSlices for the largest DRA node we plan for: 64 A100s cut into seven
1g.10gb MIG devices each (448 devices, four slices), through the real async Kubernetes client
to the API-server stand-in over HTTP on 127.0.0.1, which validates every slice it receives.

Two measures over HTTP, each against a baseline taken in the same run: the first publish (list, then
four creates) and a publish after a health change (four replaces with the next generation;
the health flips back and forth). The baseline sends the same four slices, already serialised,
as plain POSTs from one aiohttp session to a fresh stand-in: transport and the stand-in's
validation without our building, diffing and client, so the ratio is what the publisher adds.
A third, pure figure: building the devices and slices from the plan, next to serialising them.

Prepare: the real `dra serve` driver (in-process, simulated a100-80gb-x8-mixed node with its
host files laid out) registered with the plugin-watcher emulator; one NodePrepareResources per
new claim of one device (each of the node's 32 devices in turn) over the DRA socket: the claim
read from the stand-in, the checkpoint saved as started, its CDI spec written, the checkpoint
saved as complete. The baseline is the same call for a claim already prepared, answered from
the checkpoint: the gRPC round trip, the node's lock and a read of the checkpoint, so the ratio
is what reading the claim and writing the files add. Unprepare of those
claims (spec removed, checkpoint saved) is measured against the same baseline.
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
from deviceplugin.dra.driver import DraDriver
from deviceplugin.dra.kubeapi import connect
from deviceplugin.dra.publisher import SlicePublisher
from deviceplugin.model.devices import Inventory
from deviceplugin.model.slices import build_devices, build_slices
from deviceplugin.node.discovery import discover
from deviceplugin.runtime.options import DraServeOptions
from deviceplugin.sim.apiserver import PREFIX, ApiServer
from deviceplugin.sim.pluginwatcher import PluginWatcher
from deviceplugin.sim.simulator import NodeSimulator, simulator_for
from testbed.plugins import write_kubeconfig

GPUS = 64
GI_IDS = (7, 8, 9, 11, 12, 13, 14)
REPEATS = 7
CHANGES = 20
TARGET_S = 1.0
NODE = "bench-node"
PREPARE_PRESET = "a100-80gb-x8-mixed"
PREPARE_ROUNDS = 3
PREPARE_TARGET_MS = 20.0
DRIVER = "gpu.nvidia.com"


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


def discover_node(path: Path) -> Inventory:
    nvml = NodeSimulator(str(path)).open_nvml(None)
    nvml.init()
    try:
        return discover(nvml)
    finally:
        nvml.shutdown()


async def raw_posts(bodies: list[bytes]) -> float:
    """`bodies` POSTed as they are from one aiohttp session to a fresh stand-in: transport and
    the stand-in's validation alone, the baseline of a publish of the same slices."""
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


async def _first_publish(inventory: Inventory) -> float:
    server = ApiServer()
    await server.start()
    publisher = SlicePublisher(connect(server=server.url), NODE)
    try:
        started = time.perf_counter()
        if not await publisher.publish(inventory, {}):
            raise RuntimeError("publish failed")
        elapsed = time.perf_counter() - started
        if len(server.slices) != 4 or server.rejected:
            raise RuntimeError(f"stand-in holds {len(server.slices)} slices: {server.rejected}")
        return elapsed
    finally:
        await publisher.close()
        await server.stop()


async def _changes(inventory: Inventory) -> list[float]:
    server = ApiServer()
    await server.start()
    publisher = SlicePublisher(connect(server=server.url), NODE)
    sick = {inventory.gpus[GPUS // 2].uuid: "xid-79"}
    try:
        await publisher.publish(inventory, {})
        times = []
        for n in range(CHANGES):
            state = sick if n % 2 == 0 else {}
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


def allocated_claim(name: str, device: str) -> dict[str, object]:
    """A ResourceClaim as the scheduler leaves it: one request, allocated `device`."""
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"devices": {"requests": [request]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


ClaimRef = tuple[str, str, str]  # namespace, name, uid: what the kubelet sends


async def prepare_each(
    server: ApiServer, watcher: PluginWatcher, names: list[str], label: str
) -> tuple[list[ClaimRef], list[float]]:
    """A new claim allocated each of `names` (named `<label>-<n>`), each prepared alone: the
    claims, and the seconds each Prepare took. RuntimeError when one fails."""
    refs: list[ClaimRef] = []
    for n, device in enumerate(names):
        meta = server.add_claim(allocated_claim(f"{label}-{n}", device))["metadata"]
        refs.append(("bench", meta["name"], meta["uid"]))
    times = []
    for ref in refs:
        started = time.perf_counter()
        answer = await watcher.prepare(DRIVER, [ref])
        times.append(time.perf_counter() - started)
        if answer.claims[ref[2]].error:
            raise RuntimeError(f"Prepare failed: {answer.claims[ref[2]].error}")
    return refs, times


async def _prepare(root: Path) -> tuple[list[float], list[float], list[float]]:
    """Seconds per Prepare of a new claim, per repeated Prepare, per Unprepare."""
    server = ApiServer()
    await server.start()
    settings = DraServeOptions(
        simulate=PREPARE_PRESET,
        cdi_spec_dir=root / "cdi",
        kubelet_root=root / "kubelet",
        kubeconfig=str(write_kubeconfig(root / "kubeconfig", server.url)),
        node_name=NODE,
    )
    driver = DraDriver(settings, simulator=simulator_for(settings.simulate))
    watcher = PluginWatcher(settings.kubelet_root)
    fresh: list[float] = []
    repeat: list[float] = []
    unprepare: list[float] = []
    try:
        await driver.start()
        await watcher.start()
        await watcher.wait_registered(DRIVER)
        names = [d["name"] for s in server.slices.values() for d in s["spec"]["devices"]]
        for round_ in range(PREPARE_ROUNDS):
            refs, times = await prepare_each(server, watcher, names, f"c{round_}")
            fresh.extend(times)
            for ref in refs:
                started = time.perf_counter()
                await watcher.prepare(DRIVER, [ref])
                repeat.append(time.perf_counter() - started)
            for ref in refs:
                started = time.perf_counter()
                answer = await watcher.unprepare(DRIVER, [ref])
                unprepare.append(time.perf_counter() - started)
                if answer.claims[ref[2]].error:
                    raise RuntimeError(f"Unprepare failed: {answer.claims[ref[2]].error}")
        return fresh, repeat, unprepare
    finally:
        await watcher.stop()
        await driver.stop()
        await server.stop()


async def run(root: Path) -> list[Figure]:
    """Median (and p99 for changes) of each measure with its same-run baseline."""
    inventory = discover_node(write_node(root / "dra-node.yaml"))
    devices = build_devices(inventory)
    bodies = [json.dumps(s).encode() for s in build_slices(NODE, devices, 1)]
    first, base = [], []
    for _ in range(REPEATS):
        first.append(await _first_publish(inventory))
        base.append(await raw_posts(bodies))
    changes = await _changes(inventory)
    builds, dumps = [], []
    for _ in range(CHANGES):
        started = time.perf_counter()
        built = build_slices(NODE, build_devices(inventory), 2)
        middle = time.perf_counter()
        json.dumps(built)
        dumps.append(time.perf_counter() - middle)
        builds.append(middle - started)
    fresh, repeat, unprepare = await _prepare(root)
    base_median = median(base)
    label = "4 raw POSTs of the same slices"
    prepare_base = median(repeat) * 1000
    prepare_label = "repeat Prepare answered from the checkpoint"
    prepare_figures = [
        Figure(
            f"DRA Prepare of a new claim (1 device) over the DRA socket, p50 of {len(fresh)}",
            median(fresh) * 1000,
            "ms",
            target=PREPARE_TARGET_MS,
            baseline=prepare_base,
            baseline_label=prepare_label,
            samples=[f * 1000 for f in fresh],
        ),
        Figure(
            "DRA Prepare of a new claim, p99",
            p99(fresh) * 1000,
            "ms",
            baseline=prepare_base,
            baseline_label=prepare_label,
        ),
        Figure(
            "DRA Unprepare of a claim, p50",
            median(unprepare) * 1000,
            "ms",
            baseline=prepare_base,
            baseline_label=prepare_label,
            samples=[u * 1000 for u in unprepare],
        ),
    ]
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
        *prepare_figures,
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
