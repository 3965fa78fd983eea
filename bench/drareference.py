"""The DRA table of `make bench-reference`: NVIDIA's DRA kubelet plugin (`gpu-kubelet-plugin`
v0.4.1, built by e2e/reference/build.sh) and `deviceplugin dra serve`, in one run on the same
simulated node, against the same kubelet-side client and the same API server.

Each driver runs on its own copy of the driver root (`sim-root` of the preset; NVIDIA's in the
mount namespace of `testbed/plugins.py`), with its own plugin-watcher emulator
(`sim/pluginwatcher.py`) on a kubelet root of its own and its own API-server stand-in
(`sim/apiserver.py`, the Node registered as a kubelet would): both publish the pool of the same
node for `gpu.nvidia.com`, and two publishers of one pool delete each other's slices. Both
stand-ins read protobuf bodies (`testbed/kubeproto.py`; client-go sends built-in kinds so) and
serve client-go's watch-list, and validate every slice either driver sends.

- Start → slices published: from the fork to the stand-in holding every device of the node,
  REPEATS times each, alternating which goes first; in the same starts, from the fork to
  registered with the plugin watcher (which looks for sockets every WATCHER_POLL s).
- Then both at once: RSS once published and settled; then NodePrepareResources and
  NodeUnprepareResources of one-device claims over each driver's DRA socket, every device each
  driver published in turn, ROUNDS rounds, the two drivers' calls alternating one by one (the
  order reversed every round) so that machine load hits both alike. Prepares are paced PACE
  apart per driver: each reads its claim from the API server, and client-go's client-side
  limit (NVIDIA's default: 5 requests a second, bursts of 10) would otherwise be the figure.

Figures, not assertions: a measure that cannot be taken is an error row, the rest go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.comparison import OURS, REFERENCE, BenchError, Row, from_samples
from bench.dra import allocated_claim
from bench.nodes import DEFAULT_PRESET
from bench.report import median, p99
from bench.scenarios import MIB
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.pluginwatcher import PluginWatcher
from testbed import kubeproto, plugins
from testbed.process import Child, rss_bytes

LABEL = "NVIDIA gpu-kubelet-plugin v0.4.1"
NODE = "bench-node"
DRIVER = "gpu.nvidia.com"
NAMESPACE = "bench"  # where bench.dra.allocated_claim puts its claims
DEVICES = 32  # a100-80gb-x8-mixed: 4 whole GPUs and 28 MIG devices, the same for both
REPEATS = 3
ROUNDS = 2
PACE = 0.25  # s between two Prepares to one driver: 4 a second, under client-go's 5
SETTLE = 1.0  # s after publishing before RSS is read
TIMEOUT = 60.0
POLL = 0.002
WATCHER_POLL = 0.005  # s between the plugin watcher's looks for a registration socket

Decode = Callable[[bytes], kubeproto.JsonObject]


def published(server: ApiServer) -> int:
    """How many devices the stand-in's slices hold."""
    return sum(len(piece["spec"]["devices"]) for piece in server.slices.values())


@dataclass
class Driver:
    """One DRA driver with its API server and kubelet."""

    name: str
    child: Child
    server: ApiServer
    watcher: PluginWatcher
    published_in: float = 0.0  # s from the fork to every device at the API server
    registered_in: float = 0.0  # s from the fork to registered with the kubelet
    pid: int = 0  # the driver's own process

    def devices(self) -> list[str]:
        """The names of the devices it published."""
        slices = self.server.slices.values()
        return sorted(device["name"] for piece in slices for device in piece["spec"]["devices"])


async def first_held(driver: Driver, checks: Mapping[str, Callable[[], bool]]) -> dict[str, float]:
    """Seconds from the driver's fork until each check first held."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + TIMEOUT
    while True:
        for name, check in checks.items():
            if name not in seen and check():
                seen[name] = time.monotonic() - driver.child.started
        if len(seen) == len(checks):
            return seen
        if time.monotonic() > deadline or not driver.child.alive():
            state = "running" if driver.child.alive() else "exited"
            missing = ", ".join(name for name in checks if name not in seen)
            raise BenchError(f"{driver.name}: {missing} not seen ({state}):\n{driver.child.tail()}")
        await asyncio.sleep(POLL)


@contextlib.asynccontextmanager
async def running(
    name: str, work: Path, root: Path, binaries: Path, decode: Decode
) -> AsyncIterator[Driver]:
    """A stand-in with the Node and a plugin watcher in <work>, then the driver; yields once
    every device is published and the driver is registered with the kubelet."""
    work.mkdir(parents=True)
    server = ApiServer(decoders={kubeproto.CONTENT_TYPE: decode})
    await server.start()
    server.add_node(NODE)
    kubeconfig = plugins.write_kubeconfig(work / "kubeconfig", server.url)
    watcher = PluginWatcher(work / "kubelet", poll=WATCHER_POLL)
    await watcher.start()
    log = work / f"{name}.log"
    if name == REFERENCE:
        child = plugins.dra_driver(
            binaries, root, kubeconfig, NODE, work / "cdi", log, work / "kubelet"
        )
    else:
        child = plugins.ours_dra(root, kubeconfig, NODE, work / "cdi", work / "kubelet", log)
    driver = Driver(name, child, server, watcher)
    try:
        with child.start():
            seen = await first_held(
                driver,
                {
                    "every device published": lambda: published(server) >= DEVICES,
                    "registration": lambda: DRIVER in watcher.plugins,
                },
            )
            driver.published_in = seen["every device published"]
            driver.registered_in = seen["registration"]
            driver.pid = child.pid
            if name == REFERENCE:
                driver.pid = plugins.running(child.pid, plugins.DRA_EXECUTABLE)
            yield driver
    finally:
        await watcher.stop()
        await server.stop()


def roots(work: Path) -> dict[str, Path]:
    """The preset written by `sim-root` once per driver."""
    return {
        name: plugins.sim_root(DEFAULT_PRESET, work / f"dra-root-{name}")
        for name in (OURS, REFERENCE)
    }


async def startup(work: Path, binaries: Path, decode: Decode) -> list[Row]:
    """Fork → registered with the kubelet, and fork → every device at the API server,
    REPEATS times each, alternating the order."""
    node = roots(work / "start")
    published_in: dict[str, list[float]] = {OURS: [], REFERENCE: []}
    registered_in: dict[str, list[float]] = {OURS: [], REFERENCE: []}
    for i in range(REPEATS):
        for name in (OURS, REFERENCE) if i % 2 == 0 else (REFERENCE, OURS):
            directory = work / "start" / f"{name}-{i}"
            async with running(name, directory, node[name], binaries, decode) as driver:
                published_in[name].append(driver.published_in)
                registered_in[name].append(driver.registered_in)
    return [
        from_samples(f"start → slices published ({DEFAULT_PRESET}, 32 devices)", "s", published_in),
        from_samples("start → registered with the kubelet", "s", registered_in),
    ]


Call = Callable[[Driver, tuple[str, str, str]], Awaitable[float]]


async def _prepare(driver: Driver, ref: tuple[str, str, str]) -> float:
    began = time.perf_counter()
    answer = await driver.watcher.prepare(DRIVER, [ref])
    elapsed = time.perf_counter() - began
    result = answer.claims[ref[2]]
    if result.error or len(result.devices) != 1:
        raise BenchError(f"{driver.name}: Prepare of {ref[1]}: {result.error or result}")
    return elapsed


async def _unprepare(driver: Driver, ref: tuple[str, str, str]) -> float:
    began = time.perf_counter()
    answer = await driver.watcher.unprepare(DRIVER, [ref])
    elapsed = time.perf_counter() - began
    if answer.claims[ref[2]].error:
        raise BenchError(f"{driver.name}: Unprepare of {ref[1]}: {answer.claims[ref[2]].error}")
    return elapsed


async def _alternating(
    drivers: Sequence[Driver],
    refs: Mapping[str, list[tuple[str, str, str]]],
    call: Call,
    pace: float,
    samples: dict[str, list[float]],
) -> None:
    """`call` on each driver's claims, one driver then the other, `pace` s per pair."""
    for n in range(len(refs[drivers[0].name])):
        began = time.monotonic()
        for driver in drivers:
            samples[driver.name].append(await call(driver, refs[driver.name][n]) * 1000)
        await asyncio.sleep(max(0.0, pace - (time.monotonic() - began)))


async def steady(work: Path, binaries: Path, decode: Decode) -> list[Row]:
    """Both drivers at once: RSS once published, then Prepare and Unprepare."""
    node = roots(work / "steady")
    async with (
        running(OURS, work / "steady" / OURS, node[OURS], binaries, decode) as ours,
        running(REFERENCE, work / "steady" / REFERENCE, node[REFERENCE], binaries, decode) as ref,
    ):
        drivers = (ours, ref)
        await asyncio.sleep(SETTLE)
        rss = {d.name: rss_bytes(d.pid) / MIB for d in drivers}
        prepare: dict[str, list[float]] = {OURS: [], REFERENCE: []}
        unprepare: dict[str, list[float]] = {OURS: [], REFERENCE: []}
        for round_ in range(ROUNDS):
            order = drivers if round_ % 2 == 0 else drivers[::-1]
            refs: dict[str, list[tuple[str, str, str]]] = {}
            for driver in drivers:
                names = driver.devices()
                if len(names) != DEVICES:
                    raise BenchError(f"{driver.name} publishes {len(names)} devices")
                refs[driver.name] = []
                for n, device in enumerate(names):
                    meta = driver.server.add_claim(allocated_claim(f"r{round_}-{n}", device))[
                        "metadata"
                    ]
                    refs[driver.name].append((NAMESPACE, meta["name"], meta["uid"]))
            await _alternating(order, refs, _prepare, PACE, prepare)
            await _alternating(order, refs, _unprepare, 0.0, unprepare)
    count = len(prepare[OURS])
    return [
        Row("RSS once published", "MiB", rss[OURS], rss[REFERENCE]),
        Row(
            f"NodePrepareResources, 1-device claim, p50 of {count}",
            "ms",
            median(prepare[OURS]),
            median(prepare[REFERENCE]),
            samples=prepare,
        ),
        Row("NodePrepareResources p99", "ms", p99(prepare[OURS]), p99(prepare[REFERENCE])),
        Row(
            f"NodeUnprepareResources p50 of {count}",
            "ms",
            median(unprepare[OURS]),
            median(unprepare[REFERENCE]),
            samples=unprepare,
        ),
        Row("NodeUnprepareResources p99", "ms", p99(unprepare[OURS]), p99(unprepare[REFERENCE])),
    ]


Group = Callable[[Path, Path, Decode], Awaitable[list[Row]]]
GROUPS: list[tuple[str, Group]] = [
    ("DRA: start-up, one driver at a time", startup),
    ("DRA: both running: RSS, Prepare and Unprepare", steady),
]


async def measure(work: Path, binaries: Path) -> list[Row]:
    """Every DRA row; a group that breaks is an error row and the others still run."""
    try:
        decode = kubeproto.decoder(kubeproto.module_dirs())
    except RuntimeError as exc:
        return [Row("DRA: client-go's protobuf", "", None, None, error=f"RuntimeError: {exc}")]
    rows: list[Row] = []
    for name, group in GROUPS:
        print(f"bench-reference: {name} ...", file=sys.stderr, flush=True)
        try:
            rows += await group(work, binaries, decode)
        except Exception as exc:  # report what broke and go on with the other groups
            rows.append(Row(name, "", None, None, error=f"{type(exc).__name__}: {exc}"))
    return rows
