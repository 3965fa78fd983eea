"""`python -m bench.reference` (`make bench-reference`, root): NVIDIA's reference device plugin
v0.19.0 and ours, measured in one run on the same simulated node with the same config file
against the same kubelet emulator; one markdown table, each figure as ours ÷ reference.

Both plugins run at once for the steady-state figures, each on its own copy of the node (written
by the same `sim-root`, so an Xid line reaches only the plugin it is meant for) and with its own
emulator in this process's event loop: idle CPU is taken over the same window, and Allocates
alternate between the two in blocks, so a change in machine load hits both alike. Start-up and
the large node run one plugin at a time. CPU and RSS come from /proc/<pid> of each plugin's own
process: for the reference, its Go process, not the `unshare`/`sh` that starts it.

The same run then prints the DRA table of bench/drareference.py (NVIDIA's DRA kubelet plugin and
`dra serve`). These are figures, not assertions: the run exits 1 only when a measure could not be
taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc

from bench import drareference
from bench.comparison import OURS, REFERENCE, BenchError, Row, from_samples, table
from bench.nodes import DEFAULT_PRESET, MIG_RESOURCE, large_node
from bench.process import compile_sources
from bench.report import machine, median, p99
from bench.scenarios import (
    ALLOCATES,
    IDLE_SECONDS,
    MIB,
    PREFERRED_SIZE,
    TIMEOUT,
    interleaved,
    registered,
    stub,
)
from deviceplugin.demos.plugin import SEED_CONFIG, write_configmap
from deviceplugin.sim.hostroot import EVENTS_FILE
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from testbed import plugins
from testbed.process import Child, cpu_seconds, rss_bytes

RESULTS = Path(__file__).parent / "results-reference.json"
GPU = "nvidia.com/gpu"
EXPECTED = {GPU: 8, MIG_RESOURCE: 28}  # the preset with the seed config: 4 GPUs x 2, 4 x 7 MIG
REPEATS = 3
XID = 79  # "GPU has fallen off the bus": critical to both plugins
SETTLE = 0.5  # s with every resource listed in full before the next step
PREFERRED_LIMIT = 60_000.0  # ms; the reference's issue #774 reports 16-30 s for 7 GPUs
ALIGNED_PRESET = "dgx1-hybrid-cube"
ALIGNED_CONFIG = "version: v1\nflags:\n  migStrategy: none\n"
LARGE_TIMEOUT = 120.0  # s to register 1,792 IDs


# --- the plugins --------------------------------------------------------------------------------


@dataclass
class Side:
    """One plugin on its own driver root, registered with its own emulator."""

    name: str
    plugin: Child
    kubelet: KubeletEmulator
    root: Path
    config: Path
    registered_in: float = 0.0  # s from exec to every resource listed in full
    pid: int = 0  # the plugin's own process

    async def until(
        self, predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT
    ) -> float:
        """Wait for a kubelet-visible state; the monotonic time it was seen."""
        if not await self.kubelet.wait_for(predicate, timeout):
            state = "running" if self.plugin.exit_code() is None else "exited"
            raise BenchError(
                f"{self.name}: {what} not seen in {timeout:.0f} s ({state}):\n{self.plugin.tail()}"
            )
        return time.monotonic()

    async def settle(self, expected: Mapping[str, int]) -> None:
        """Every resource registered and listed in full, and still so SETTLE s later."""
        await self.until(registered(self.kubelet, expected, 0.0), "every resource listed")
        await asyncio.sleep(SETTLE)
        await self.until(registered(self.kubelet, expected, 0.0), "every resource listed")

    def socket(self, resource: str) -> Path:
        return self.kubelet.directory / self.kubelet.endpoints[resource].endpoint

    def reconfigure(self, replicas: int) -> None:
        """The seed config with `replicas`, laid out as the kubelet updates a ConfigMap volume.
        Ours watches the file; the reference is sent SIGHUP, as its config-manager sidecar does."""
        write_configmap(self.config.parent, SEED_CONFIG.format(replicas=replicas))
        if self.name == REFERENCE:
            os.kill(self.pid, signal.SIGHUP)


@contextlib.asynccontextmanager
async def started(
    name: str,
    work: Path,
    root: Path,
    config: Path,
    binaries: Path,
    expected: Mapping[str, int],
    timeout: float = TIMEOUT,
) -> AsyncIterator[Side]:
    """An emulator in <work>, then the plugin; yields once every resource is listed in full."""
    (work / "cdi").mkdir(parents=True)
    kubelet = KubeletEmulator(work / "k")
    log = work / f"{name}.log"
    if name == REFERENCE:
        plugin = plugins.reference(binaries, root, kubelet.directory, config, log)
    else:
        plugin = plugins.ours(root, kubelet.directory, config, work / "cdi", log)
    side = Side(name, plugin, kubelet, root, config)
    await kubelet.start()
    try:
        with plugin.start():
            seen = await side.until(registered(kubelet, expected, plugin.started), "start", timeout)
            side.registered_in = seen - plugin.started
            side.pid = plugins.reference_pid(plugin) if name == REFERENCE else plugin.pid
            yield side
    finally:
        await kubelet.stop()


@dataclass(frozen=True)
class Node:
    """The preset written twice by `sim-root`, one copy per plugin, with a ConfigMap each."""

    roots: dict[str, Path]
    configs: dict[str, Path]

    @staticmethod
    def make(work: Path) -> Node:
        roots, configs = {}, {}
        for name in (OURS, REFERENCE):
            roots[name] = plugins.sim_root(DEFAULT_PRESET, work / f"root-{name}")
            configs[name] = write_configmap(work / f"cm-{name}", SEED_CONFIG.format(replicas=2))
        return Node(roots, configs)


# --- the measures -------------------------------------------------------------------------------


async def startup(work: Path, node: Node, binaries: Path) -> list[Row]:
    """Exec → every resource listed in full, REPEATS times each, alternating which goes first."""
    samples: dict[str, list[float]] = {OURS: [], REFERENCE: []}
    for i in range(REPEATS):
        for name in (OURS, REFERENCE) if i % 2 == 0 else (REFERENCE, OURS):
            directory = work / f"start-{name}-{i}"
            async with started(
                name, directory, node.roots[name], node.configs[name], binaries, EXPECTED
            ) as side:
                samples[name].append(side.registered_in)
    return [
        from_samples(f"start → every resource registered ({DEFAULT_PRESET}, 36 IDs)", "s", samples)
    ]


async def steady(work: Path, node: Node, binaries: Path) -> list[Row]:
    """Both plugins at once: idle, Allocate; then one at a time: Xid, config change, kubelet
    restart."""
    async with (
        started(
            OURS, work / OURS, node.roots[OURS], node.configs[OURS], binaries, EXPECTED
        ) as ours,
        started(
            REFERENCE,
            work / REFERENCE,
            node.roots[REFERENCE],
            node.configs[REFERENCE],
            binaries,
            EXPECTED,
        ) as reference,
    ):
        sides = (ours, reference)
        rows = await idle(sides)
        rows += await allocate(sides)
        for measure, unit, each in (
            ("Xid 79 line appended → Unhealthy at the kubelet", "ms", xid),
            ("config change (replicas 2 → 4) → new list at the kubelet", "ms", config_change),
            ("kubelet restart → every resource registered again", "ms", kubelet_restart),
        ):
            rows.append(
                from_samples(measure, unit, {side.name: await each(side) for side in sides})
            )
        return rows


async def idle(sides: Sequence[Side]) -> list[Row]:
    """RSS right after registration; CPU of both over the same idle window."""
    rss = {side.name: rss_bytes(side.pid) / MIB for side in sides}
    before = {side.name: cpu_seconds(side.pid) for side in sides}
    await asyncio.sleep(IDLE_SECONDS)
    used = {side.name: cpu_seconds(side.pid) - before[side.name] for side in sides}
    return [
        Row("RSS idle after registration", "MiB", rss[OURS], rss[REFERENCE]),
        Row(f"CPU over {IDLE_SECONDS:.0f} s idle", "CPU s", used[OURS], used[REFERENCE]),
    ]


def _allocator(
    client: api_pb2_grpc.DevicePluginStub, requests: Sequence[api_pb2.AllocateRequest]
) -> Callable[[int], Awaitable[object]]:
    return lambda i: client.Allocate(requests[i % len(requests)])


async def allocate(sides: Sequence[Side]) -> list[Row]:
    """ALLOCATES one-device Allocates to each plugin's nvidia.com/gpu, rotating over its IDs,
    in alternating blocks; then RSS."""
    calls: dict[str, Callable[[int], Awaitable[object]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for side in sides:
            channel, client = stub(side.socket(GPU))
            await stack.enter_async_context(channel)
            requests = [
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[i])]
                )
                for i in sorted(side.kubelet.devices(GPU))
            ]
            calls[side.name] = _allocator(client, requests)
        times = await interleaved(calls, ALLOCATES)
    ms = {name: [s * 1000 for s in samples] for name, samples in times.items()}
    rss = {side.name: rss_bytes(side.pid) / MIB for side in sides}
    return [
        Row("Allocate p50 (1 device, over gRPC)", "ms", median(ms[OURS]), median(ms[REFERENCE])),
        Row("Allocate p99", "ms", p99(ms[OURS]), p99(ms[REFERENCE])),
        Row(f"RSS after {ALLOCATES:,} Allocates", "MiB", rss[OURS], rss[REFERENCE]),
    ]


def _one_unhealthy(kubelet: KubeletEmulator, uuid: str) -> Callable[[], bool]:
    """Any device of GPU `uuid` Unhealthy: the reference marks only one of a time-sliced GPU's
    replicas, ours every one."""
    return lambda: any(
        not device.healthy for i, device in kubelet.devices(GPU).items() if i.startswith(uuid)
    )


async def xid(side: Side) -> list[float]:
    """Append an Xid line for a whole GPU (a different one each time) to the driver root's
    events file, read by both through the simulated NVML; ms until the kubelet sees it."""
    samples = []
    gpus = sorted({device.split("::")[0] for device in side.kubelet.devices(GPU)})
    for uuid in gpus[:REPEATS]:
        began = time.monotonic()
        with (side.root / EVENTS_FILE).open("a") as events:
            events.write(json.dumps({"uuid": uuid, "xid": XID}) + "\n")
        seen = await side.until(_one_unhealthy(side.kubelet, uuid), f"{uuid} Unhealthy")
        samples.append((seen - began) * 1000)
    return samples


async def config_change(side: Side) -> list[float]:
    """The whole path to a new list: new config file (and SIGHUP for the reference) → the
    16-ID list at the kubelet. Back to 2 replicas, untimed, between repeats."""
    samples = []
    for _ in range(REPEATS):
        began = time.monotonic()
        side.reconfigure(4)
        seen = await side.until(registered(side.kubelet, {GPU: 16}, 0.0), "replicas 4")
        samples.append((seen - began) * 1000)
        await side.settle({**EXPECTED, GPU: 16})
        side.reconfigure(2)
        await side.settle(EXPECTED)
    return samples


async def kubelet_restart(side: Side) -> list[float]:
    """The emulator restarts (sockets deleted, kubelet.sock new); ms from listening again to
    every resource registered again with its list."""
    samples = []
    for _ in range(REPEATS):
        await side.kubelet.stop()
        began = time.monotonic()
        await side.kubelet.start()
        seen = await side.until(registered(side.kubelet, EXPECTED, began), "re-registration")
        samples.append((seen - began) * 1000)
        await side.settle(EXPECTED)
    return samples


async def large(work: Path, node: Node, binaries: Path) -> list[Row]:
    """16 A100s x 7 MIG 1g.10gb, time-sliced 16 ways (1,792 IDs; bench/nodes.py): exec →
    registered, then GetPreferredAllocation of 8 out of all 1,792. The reference answers a
    replicated resource with its `distributedAlloc` policy."""
    setup = large_node(work)
    root = plugins.sim_root(setup.simulate, work / "root-large")
    start, chosen = await preference(
        work / "large", binaries, root, setup.config_file, setup.expected, PREFERRED_SIZE
    )
    ids = f"{setup.expected[MIG_RESOURCE]:,} IDs"
    return [
        from_samples(f"{ids}: start → registered", "s", start),
        from_samples(
            f"{ids}: GetPreferredAllocation of {PREFERRED_SIZE}", "ms", chosen, PREFERRED_LIMIT
        ),
    ]


async def aligned(work: Path, node: Node, binaries: Path) -> list[Row]:
    """The request of the reference's issue #774: 7 out of 8 whole GPUs, no sharing, on the
    DGX-1's hybrid cube mesh (NVLink between some pairs only). The reference answers whole GPUs
    with its `alignedAlloc` policy (go-gpuallocator), the path that issue timed."""
    root = plugins.sim_root(ALIGNED_PRESET, work / "root-aligned")
    config = work / "aligned-config.yaml"
    config.write_text(ALIGNED_CONFIG)
    _, chosen = await preference(work / "aligned", binaries, root, config, {GPU: 8}, 7)
    return [
        from_samples(
            f"7 of 8 whole GPUs ({ALIGNED_PRESET}): GetPreferredAllocation",
            "ms",
            chosen,
            PREFERRED_LIMIT,
        )
    ]


async def preference(
    work: Path, binaries: Path, root: Path, config: Path, expected: Mapping[str, int], size: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each plugin in turn on `root`: s from exec to registered, and ms per
    GetPreferredAllocation of `size` out of all the IDs of the (one) expected resource."""
    start: dict[str, list[float]] = {}
    chosen: dict[str, list[float]] = {}
    for name in (OURS, REFERENCE):
        async with started(
            name, work / name, root, config, binaries, expected, LARGE_TIMEOUT
        ) as side:
            start[name] = [side.registered_in]
            chosen[name] = await preferred(side, next(iter(expected)), size)
    return start, chosen


async def preferred(side: Side, resource: str, size: int) -> list[float]:
    """ms per call, REPEATS calls; a call over PREFERRED_LIMIT is cut there and not repeated."""
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=sorted(side.kubelet.devices(resource)), allocation_size=size
            )
        ]
    )
    samples: list[float] = []
    channel, client = stub(side.socket(resource))
    async with channel:
        for _ in range(REPEATS):
            began = time.monotonic()
            try:
                answer = await client.GetPreferredAllocation(
                    request, timeout=PREFERRED_LIMIT / 1000
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
                return samples
            samples.append((time.monotonic() - began) * 1000)
            if len(answer.container_responses[0].deviceIDs) != size:
                raise BenchError(f"{side.name}: preferred allocation of the wrong size: {answer}")
    return samples


# --- the run ------------------------------------------------------------------------------------

Group = Callable[[Path, Node, Path], Awaitable[list[Row]]]
GROUPS: list[tuple[str, Group]] = [
    ("start-up, one plugin at a time", startup),
    ("both running: idle, Allocate; Xid, config change, kubelet restart", steady),
    ("1,792 IDs: start-up and preferred allocation", large),
    ("7 of 8 whole GPUs: preferred allocation", aligned),
]


async def measure(work: Path, binaries: Path) -> list[Row]:
    node = Node.make(work)
    rows: list[Row] = []
    for name, group in GROUPS:
        print(f"bench-reference: {name} ...", file=sys.stderr, flush=True)
        try:
            rows += await group(work, node, binaries)
        except Exception as exc:  # report what broke and go on with the other groups
            rows.append(Row(name, "", None, None, error=f"{type(exc).__name__}: {exc}"))
    return rows


def main() -> int:
    binaries = plugins.runnable_binaries()
    compile_sources()  # start-up measured as an installed package starts, as `make bench` does
    began = time.monotonic()
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    work = Path(tempfile.mkdtemp(prefix="dp-benchref-"))
    try:
        rows = asyncio.run(measure(work, binaries))
        dra_rows = asyncio.run(drareference.measure(work, binaries))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    duration = time.monotonic() - began
    print(table(rows))
    print()
    print(table(dra_rows, drareference.LABEL))
    for row in rows + dra_rows:
        if row.error:
            print(f"\n{row.measure}: {row.error}", file=sys.stderr)
    about = machine()
    print(
        f"\n{stamp}, {duration:.0f} s; {about['cpus']} CPUs ({about['cpu_model']}), Linux "
        f"{about['kernel']}, Python {about['python']}, grpcio {about['grpcio']}; "
        f"load average {os.getloadavg()[0]:.2f}; samples in {RESULTS}"
    )
    payload = {
        "machine": about,
        "started": stamp,
        "duration_s": round(duration, 1),
        "rows": [asdict(row) for row in rows],
        "dra_rows": [asdict(row) for row in dra_rows],
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    return 1 if any(row.error for row in rows + dra_rows) else 0


if __name__ == "__main__":
    sys.exit(main())
