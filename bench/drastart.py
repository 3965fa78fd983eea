"""`dra serve` from exec to its ResourceSlices published, and its memory once published, each
against its floor (bench/drafloor.py) taken in turn in the same run.

The real `deviceplugin dra serve` process on the simulated preset of the device-plugin figures,
publishing through its Kubernetes client; the floor is a bare grpc.aio server process that
POSTs the same slice with the standard library. Both publish to a fresh instant API server
(`bench/instantapi.py`) in the benchmark's own loop, which answers at once and checks nothing,
so that no server's cost sits in either time. Each is timed from the fork to the moment its
server holds every device of the node. The two start in turn ROUNDS times, whichever went
second going first the next round, so a machine that slows down meanwhile moves both alike.
RSS is read IDLE seconds after publishing, for both.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import process
from bench.dra import discover_node
from bench.instantapi import InstantApi
from bench.nodes import DEFAULT_PRESET
from bench.report import Figure, median
from deviceplugin.dra.registration import PLUGIN_TYPE, SUPPORTED_SERVICES
from deviceplugin.model.slices import build_devices, build_slices
from deviceplugin.sim.node import resolve_node_path
from deviceplugin.wire.pluginregistration.v1 import api_pb2
from testbed.budgets import DRA_SERVE_RSS_MIB
from testbed.plugins import write_kubeconfig
from testbed.process import Child

NODE = "bench-node"
DRIVER = "gpu.nvidia.com"
ROUNDS = 5
TIMEOUT = 30.0
POLL = 0.001
IDLE = 1.0  # seconds after publishing before RSS is read, as for `serve`
START_TARGET = 3.0  # exec → published, times the floor's of the same run
RSS_TARGET = DRA_SERVE_RSS_MIB  # once published (testbed/budgets.py, asserted by make test)
MIB = 1024 * 1024


@dataclass
class Starts:
    """Seconds from fork to published, CPU seconds spent by then, and RSS (bytes) once
    published, per round."""

    serve: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    serve_cpu: list[float] = field(default_factory=list)
    floor_cpu: list[float] = field(default_factory=list)
    serve_rss: list[int] = field(default_factory=list)
    floor_rss: list[int] = field(default_factory=list)
    devices: int = 0  # on the node, in the one slice both publish


def node_slice(path: Path) -> tuple[Path, int]:
    """The one ResourceSlice `dra serve` publishes for the preset, written to `path` as the
    floor's body, and how many devices it holds."""
    devices = build_devices(discover_node(resolve_node_path(DEFAULT_PRESET)))
    slices = build_slices(NODE, devices, 1)
    if len(slices) != 1:
        raise RuntimeError(f"the preset publishes {len(slices)} slices; the floor POSTs one")
    path.write_text(json.dumps(slices[0]))
    return path, len(devices)


def plugin_info(path: Path, socket: Path) -> Path:
    """The PluginInfo a DRA driver's registration socket answers, serialized to `path` for the
    floor, which imports no stubs."""
    info = api_pb2.PluginInfo(
        type=PLUGIN_TYPE,
        name=DRIVER,
        endpoint=str(socket),
        supported_versions=list(SUPPORTED_SERVICES),
    )
    path.write_bytes(info.SerializeToString())
    return path


async def until_published(
    make: Callable[[InstantApi], Child], expected: int
) -> tuple[float, float, int]:
    """Start the child that `make` builds for a fresh instant server; seconds from its fork
    until the server holds `expected` devices, the CPU seconds it had spent by then, and its
    RSS IDLE seconds later."""
    server = InstantApi()
    await server.start()
    child = make(server)
    try:
        child.start()
        deadline = child.started + TIMEOUT
        while server.devices < expected:
            if time.monotonic() > deadline or not child.alive():
                raise RuntimeError(f"{child.argv[:4]} published no slices:\n{child.tail()}")
            await asyncio.sleep(POLL)
        seconds, cpu = time.monotonic() - child.started, child.cpu_seconds()
        await asyncio.sleep(IDLE)
        return seconds, cpu, child.rss_bytes()
    finally:
        await asyncio.to_thread(child.stop)
        await server.stop()


async def measure(root: Path, rounds: int = ROUNDS) -> Starts:
    """`dra serve` and its floor in turn, `rounds` times each."""
    body, expected = node_slice(root / "drafloor-slice.json")
    starts = Starts(devices=expected)

    async def serve(i: int) -> None:
        directory = root / f"dra{i}"
        directory.mkdir()

        def make(server: InstantApi) -> Child:
            kubeconfig = write_kubeconfig(directory / "kubeconfig", server.url)
            return process.dra_serve(directory, directory / "k", DEFAULT_PRESET, kubeconfig, NODE)

        seconds, cpu, rss = await until_published(make, expected)
        starts.serve.append(seconds)
        starts.serve_cpu.append(cpu)
        starts.serve_rss.append(rss)

    async def floor(i: int) -> None:
        directory = root / f"drafloor{i}"
        directory.mkdir()

        def make(server: InstantApi) -> Child:
            socket = directory / "reg.sock"
            info = plugin_info(directory / "plugin-info.bin", socket)
            return process.dra_floor(directory, socket, server.url, body, info)

        seconds, cpu, rss = await until_published(make, expected)
        starts.floor.append(seconds)
        starts.floor_cpu.append(cpu)
        starts.floor_rss.append(rss)

    for i in range(rounds):
        for step in (floor, serve) if i % 2 == 0 else (serve, floor):
            await step(i)
    return starts


async def run(root: Path) -> list[Figure]:
    """The figures: start, start ÷ floor, RSS, each with the floor of the same run."""
    starts = await measure(root)
    floor = median(starts.floor)
    rounds = len(starts.floor)
    label = f"bare grpc.aio + one stdlib POST, exec → published (median of {rounds}, in turn)"
    rss = [r / MIB for r in starts.serve_rss]
    return [
        Figure(
            f"dra serve: start → slices published ({DEFAULT_PRESET}, {starts.devices} devices)",
            median(starts.serve),
            "s",
            baseline=floor,
            baseline_label=label,
            samples=starts.serve,
        ),
        Figure(
            "dra serve: start → slices published ÷ floor",
            median(starts.serve) / floor,
            "x",
            target=START_TARGET,
        ),
        Figure(
            "dra serve: CPU spent by the time it is published ÷ floor's",
            median(starts.serve_cpu) / median(starts.floor_cpu),
            "x",
            baseline=median(starts.floor_cpu),
            baseline_label="CPU s of the floor, exec → published",
        ),
        Figure(
            "dra serve: RSS once published",
            median(rss),
            "MiB",
            target=RSS_TARGET,
            baseline=median([r / MIB for r in starts.floor_rss]),
            baseline_label="floor, once published",
            samples=rss,
        ),
    ]
