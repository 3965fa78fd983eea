"""A node in the middle of a migration to DRA: what reading the kubelet's PodResources costs the
driver while a departed device plugin's pod holds a GPU, and how soon the GPU is published once
the kubelet reports the pod gone.

Two real `dra serve` processes on the simulated preset, each with its own kubelet directory, a
PodResources emulator and an instant API server in the benchmark's loop. On one a device plugin
was there (the kubelet's device-manager checkpoint names `nvidia.com/gpu`) and a pod holds a
GPU, so it reads PodResources at every check; the other holds nothing and reads nothing. Their
CPU is taken over the same idle window: the ratio is what the reads cost. Then the pod ends
and the time until the held GPU's device is published again is taken (once: a driver that
holds nothing reads no more, since no device plugin is left to hand anything out).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from bench import process
from bench.dra import discover_node
from bench.instantapi import InstantApi
from bench.nodes import DEFAULT_PRESET
from bench.report import Figure
from deviceplugin.sim.node import resolve_node_path
from deviceplugin.sim.podresources import PodResourcesEmulator
from testbed.plugins import write_kubeconfig
from testbed.process import Child

NODE = "bench-node"
IDLE_SECONDS = 20.0
TIMEOUT = 30.0
POLL = 0.01
FREED_TARGET = 10.0  # seconds from the pod's end to its GPU published again
HOLDER = ("team", "trainer")


@dataclass
class Side:
    """One driver with its own API server and PodResources."""

    api: InstantApi
    pods: PodResourcesEmulator
    child: Child


async def start_side(directory: Path, held: str | None) -> Side:
    """A `dra serve` whose PodResources reports `held` (a GPU UUID) for HOLDER, or nothing."""
    directory.mkdir()
    kubelet = directory / "k"
    plugins = kubelet / "device-plugins"
    plugins.mkdir(parents=True)
    if held is not None:
        entry = {"PodUID": "u", "ContainerName": "main", "ResourceName": "nvidia.com/gpu"}
        checkpoint = {"Data": {"PodDeviceEntries": [entry]}}
        (plugins / "kubelet_internal_checkpoint").write_text(json.dumps(checkpoint))
    pods = PodResourcesEmulator(kubelet)
    await pods.start()
    if held is not None:
        pods.assign(*HOLDER, "main", "nvidia.com/gpu", [held])
    api = InstantApi()
    await api.start()
    kubeconfig = write_kubeconfig(directory / "kubeconfig", api.url)
    child = process.dra_serve(directory, kubelet, DEFAULT_PRESET, kubeconfig, NODE)
    child.start()
    return Side(api, pods, child)


async def until(side: Side, devices: int) -> float:
    """Seconds until `side`'s API server holds `devices` published devices."""
    began = time.monotonic()
    while side.api.published != devices:
        if time.monotonic() - began > TIMEOUT or not side.child.alive():
            raise RuntimeError(f"{side.api.published} devices, not {devices}:\n{side.child.tail()}")
        await asyncio.sleep(POLL)
    return time.monotonic() - began


async def stop(side: Side) -> None:
    await asyncio.to_thread(side.child.stop)
    await side.pods.stop()
    await side.api.stop()


async def run(root: Path) -> list[Figure]:
    inventory = discover_node(resolve_node_path(DEFAULT_PRESET))
    every = 32  # the preset as DRA publishes it
    whole = next(gpu for gpu in inventory.gpus if not gpu.mig_enabled)
    holding = await start_side(root / "holding", whole.uuid)
    quiet = await start_side(root / "quiet", None)
    try:
        await until(holding, every - 1)
        await until(quiet, every)
        cpu = [holding.child.cpu_seconds(), quiet.child.cpu_seconds()]
        calls = holding.pods.calls
        await asyncio.sleep(IDLE_SECONDS)
        used = [holding.child.cpu_seconds() - cpu[0], quiet.child.cpu_seconds() - cpu[1]]
        reads = holding.pods.calls - calls
        holding.pods.release(*HOLDER)
        freed = await until(holding, every)
    finally:
        await stop(holding)
        await stop(quiet)
    return [
        Figure(
            f"dra serve: idle CPU over {IDLE_SECONDS:.0f} s with a GPU held "
            f"({reads} PodResources reads)",
            used[0],
            "CPU s",
            baseline=used[1],
            baseline_label="the same driver holding nothing, same window",
        ),
        Figure(
            "dra serve: a freed GPU published again after its pod ends",
            freed,
            "s",
            target=FREED_TARGET,
        ),
    ]
