"""The measures. Each drives a real `deviceplugin serve` process through the kubelet emulator
(running in this process's event loop) and times what the kubelet sees, next to a baseline taken
in the same run: the echo server of bench/echo.py, or the emulator's own round-trip.

Times are `time.monotonic()` from the action (fork, file append, symlink swap, socket listen)
to the moment the emulator has the resulting list; each is repeated REPEATS times and the median
reported, since a single start-up or reload varies with what the machine is doing. Start-up, the
most variable, starts `serve` and the echo in turn START_REPEATS times each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench import process
from bench.echo import register, write_answers
from bench.nodes import MIG_RESOURCE, NodeSetup, default_node, large_node, swap_replicas
from bench.report import Figure, median, p99
from deviceplugin.sim.kubelet import Endpoint, KubeletEmulator
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from testbed.budgets import SERVE_RSS_MIB
from testbed.process import Child

REPEATS = 5
START_REPEATS = 9  # exec → registered varies most from run to run: more starts, taken in turn
IDLE_SECONDS = 20.0
ALLOCATES = 2000
WARMUP = 50
BLOCK = 50  # calls in a row to one server before switching to the other
PREFERRED_CALLS = 200
LARGE_ALLOCATES = 1000
PREFERRED_SIZE = 8
TIMEOUT = 30.0  # only a broken plugin takes this long; a slow one is a "miss", not an error
ECHO_RESOURCE = "bench.example/echo"
MIB = 1024 * 1024
START_TARGET = 1.5  # exec → registered, times the echo's of the same run
RSS_TARGET = SERVE_RSS_MIB  # idle and after the Allocates (testbed/budgets.py; make test holds it)
RSS_OVER_ECHO = 7.0  # MiB over the echo's RSS of the same run, the same goal on any machine
ALLOCATE_TARGET = 1.1  # Allocate median, times the echo's


class BenchError(Exception):
    """A measure could not be taken: the plugin exited or never showed the expected state."""


@dataclass
class Run:
    """One `serve` process on a fresh kubelet directory, with the emulator it registers with."""

    directory: Path
    kubelet: KubeletEmulator
    child: Child
    setup: NodeSetup
    events: Path

    def socket(self, resource: str) -> Path:
        """The socket `resource` registered with."""
        return self.kubelet.directory / self.kubelet.endpoints[resource].endpoint

    async def until(self, predicate: Callable[[], bool], what: str) -> float:
        """Wait for a kubelet-visible state; the monotonic time it was seen."""
        if not await self.kubelet.wait_for(predicate, TIMEOUT):
            state = "exited" if not self.child.alive() else "running"
            raise BenchError(
                f"{what} not seen in {TIMEOUT:.0f} s (serve {state}):\n{self.child.tail()}"
            )
        return time.monotonic()

    def registered(self, since: float) -> Callable[[], bool]:
        """Every resource registered after `since` and its first list received in full."""
        return registered(self.kubelet, self.setup.expected, since)


def registered(
    kubelet: KubeletEmulator, expected: Mapping[str, int], since: float
) -> Callable[[], bool]:
    """A predicate: each expected resource registered after `since`, its list in full."""

    def check() -> bool:
        for name, count in expected.items():
            endpoint = kubelet.endpoints.get(name)
            if (
                endpoint is None
                or not endpoint.connected
                or endpoint.registered_at < since
                or endpoint.updates == 0
                or len(endpoint.devices) != count
            ):
                return False
        return True

    return check


@contextlib.asynccontextmanager
async def running(root: Path, name: str, make: Callable[[Path], NodeSetup]) -> AsyncIterator[Run]:
    """Start an emulator and then `serve` in <root>/<name>; stop both whatever happens."""
    directory = root / name
    directory.mkdir()
    setup = make(directory)
    events = directory / "events.jsonl"
    events.touch()
    kubelet = KubeletEmulator(directory / "k")
    child = process.serve(directory, kubelet.directory, setup.simulate, setup.config_file, events)
    try:
        await kubelet.start()
        child.start()
        yield Run(directory, kubelet, child, setup, events)
    finally:
        await asyncio.to_thread(child.stop)
        await kubelet.stop()


@contextlib.asynccontextmanager
async def echo_server(
    kubelet: KubeletEmulator,
    log_dir: Path,
    name: str,
    answers: Path | None,
    register_as: str | None = None,
) -> AsyncIterator[Child]:
    """An echo process on <kubelet dir>/<name>, ready for calls (and registered, if asked)."""
    socket = kubelet.directory / name
    child = process.echo(log_dir, socket, answers, register_as)
    try:
        child.start()
        if register_as:
            expected = {register_as: _listed(answers)}
            ok = await kubelet.wait_for(registered(kubelet, expected, child.started), TIMEOUT)
        else:
            ok = await _ready(socket)
        if not ok:
            raise BenchError(f"echo server did not come up:\n{child.tail()}")
        yield child
    finally:
        await asyncio.to_thread(child.stop)


def _listed(answers: Path | None) -> int:
    path = answers / "ListAndWatch.bin" if answers else None
    if path is None or not path.exists():
        return 0
    return len(api_pb2.ListAndWatchResponse.FromString(path.read_bytes()).devices)


async def _ready(socket: Path) -> bool:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if socket.exists():
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(channel.channel_ready(), 1.0)
                    return True
        await asyncio.sleep(0.01)
    return False


def stub(socket: Path) -> tuple[grpc.aio.Channel, api_pb2_grpc.DevicePluginStub]:
    """A client for the DevicePlugin service on `socket`, as the kubelet dials it."""
    channel = grpc.aio.insecure_channel(f"unix://{socket}")
    return channel, api_pb2_grpc.DevicePluginStub(channel)


async def interleaved(
    calls: Mapping[str, Callable[[int], Awaitable[object]]], count: int
) -> dict[str, list[float]]:
    """`count` timed calls to each target after WARMUP untimed ones, BLOCK at a time in turn
    (order reversed every round), so drift in machine load hits every target alike."""
    names = list(calls)
    for name in names:
        for i in range(WARMUP):
            await calls[name](i)
    times: dict[str, list[float]] = {name: [] for name in names}
    for start in range(0, count, BLOCK):
        order = names if (start // BLOCK) % 2 == 0 else names[::-1]
        for name in order:
            call, samples = calls[name], times[name]
            for i in range(start, min(count, start + BLOCK)):
                began = time.perf_counter()
                await call(i)
                samples.append(time.perf_counter() - began)
    return times


def _ms(samples: list[float]) -> list[float]:
    return [s * 1000 for s in samples]


# --- start-up ---------------------------------------------------------------------------------


async def start_to_registered(root: Path, name: str, make: Callable[[Path], NodeSetup]) -> float:
    """Seconds from fork to every resource's first full list at the kubelet, once."""
    async with running(root, name, make) as run:
        seen = await run.until(run.registered(run.child.started), "registration")
        return seen - run.child.started


async def echo_start_to_registered(root: Path, name: str) -> float:
    """The floor, once: a bare grpc.aio server process from fork to registered with a list."""
    directory = root / name
    directory.mkdir()
    kubelet = KubeletEmulator(directory / "k")
    try:
        await kubelet.start()
        async with echo_server(kubelet, directory, "echo.sock", None, ECHO_RESOURCE) as child:
            return time.monotonic() - child.started
    finally:
        await kubelet.stop()


async def startup(root: Path) -> list[Figure]:
    """Fork → registered on the preset and on the large node, against the echo's fork →
    registered. The echo and `serve` on the preset start in turn, START_REPEATS times each,
    whichever went second going first the next time, so a machine that speeds up or slows down
    meanwhile moves both alike."""
    floors, default = [], []
    for i in range(START_REPEATS):
        echo = echo_start_to_registered(root, f"echo{i}")
        serve = start_to_registered(root, f"start{i}", default_node)
        if i % 2:
            default.append(await serve)
            floors.append(await echo)
        else:
            floors.append(await echo)
            default.append(await serve)
    floor = median(floors)
    label = f"echo process start → registered (median of {len(floors)}, in turn)"
    large = [await start_to_registered(root, f"large{i}", large_node) for i in range(REPEATS)]
    return [
        Figure(
            "start → every resource registered (a100-80gb-x8-mixed, 36 IDs)",
            median(default),
            "s",
            target=1.0,
            baseline=floor,
            baseline_label=label,
            samples=default,
        ),
        Figure(
            "start → registered ÷ echo start → registered",
            median(default) / floor,
            "x",
            target=START_TARGET,
        ),
        Figure(
            "1,792 IDs: start → registered",
            median(large),
            "s",
            target=2.0,
            baseline=floor,
            baseline_label=label,
            samples=large,
        ),
    ]


# --- the default node: idle, Allocate, events, reloads, kubelet restarts ----------------------


async def default_node_figures(root: Path) -> list[Figure]:
    """One `serve` on the preset, measured in turn: idle CPU, Allocate against the echo, RSS,
    Xid → Unhealthy, ConfigMap swap, kubelet restart."""
    figures: list[Figure] = []
    async with running(root, "main", default_node) as run:
        await run.until(run.registered(run.child.started), "registration")
        async with echo_server(
            run.kubelet, run.directory, "idle.sock", None, ECHO_RESOURCE
        ) as echo:
            figures += await _idle(run, echo)
        answers, requests = await _allocate_answers(run)
        async with echo_server(
            run.kubelet, run.directory, "echo.sock", answers, ECHO_RESOURCE
        ) as echo:
            figures += await _allocate(run, requests, echo)
            push = await _echo_push(run)
            figures.append(await _xid(run, push))
            figures.append(await _configmap(run, push))
        figures.append(await _kubelet_restart(run))
    return figures


async def _idle(run: Run, echo: Child) -> list[Figure]:
    """CPU of the plugin and of a registered echo over the same idle window, and their RSS."""
    rss, echo_rss = run.child.rss_bytes() / MIB, echo.rss_bytes() / MIB
    before, echo_before = run.child.cpu_seconds(), echo.cpu_seconds()
    await asyncio.sleep(IDLE_SECONDS)
    used, echo_used = run.child.cpu_seconds() - before, echo.cpu_seconds() - echo_before
    return [
        Figure(
            f"CPU over {IDLE_SECONDS:.0f} s idle after registration",
            used,
            "CPU s",
            target=0.05,
            baseline=echo_used,
            baseline_label="echo, same window",
        ),
        Figure(
            "RSS idle after registration",
            rss,
            "MiB",
            target=RSS_TARGET,
            baseline=echo_rss,
            baseline_label="echo",
        ),
        Figure("RSS idle over the echo's", rss - echo_rss, "MiB", target=RSS_OVER_ECHO),
    ]


async def _allocate_answers(run: Run) -> tuple[Path, list[api_pb2.AllocateRequest]]:
    """One request per advertised GPU replica, and the plugin's own answers for the echo."""
    ids = sorted(run.kubelet.devices("nvidia.com/gpu"))
    requests = [
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[i])]
        )
        for i in ids
    ]
    channel, plugin = stub(run.socket("nvidia.com/gpu"))
    async with channel:
        answer = await plugin.Allocate(requests[0])
        stream = plugin.ListAndWatch(api_pb2.Empty())
        listed = await stream.read()
        stream.cancel()
    assert isinstance(listed, api_pb2.ListAndWatchResponse)
    answers = write_answers(run.directory / "answers", Allocate=answer, ListAndWatch=listed)
    return answers, requests


async def _allocate(
    run: Run, requests: list[api_pb2.AllocateRequest], echo_child: Child
) -> list[Figure]:
    plugin_channel, plugin = stub(run.socket("nvidia.com/gpu"))
    echo_channel, echo = stub(run.kubelet.directory / "echo.sock")
    async with plugin_channel, echo_channel:
        times = await interleaved(
            {
                "plugin": lambda i: plugin.Allocate(requests[i % len(requests)]),
                "echo": lambda i: echo.Allocate(requests[i % len(requests)]),
            },
            ALLOCATES,
        )
    rss, echo_rss = run.child.rss_bytes() / MIB, echo_child.rss_bytes() / MIB
    ours, base = _ms(times["plugin"]), _ms(times["echo"])
    return [
        Figure(
            "Allocate median (1 device, over gRPC)",
            median(ours),
            "ms",
            baseline=median(base),
            baseline_label="echo",
        ),
        Figure("Allocate p99", p99(ours), "ms", baseline=p99(base), baseline_label="echo"),
        Figure(
            "Allocate median ÷ echo median",
            median(ours) / median(base),
            "x",
            target=ALLOCATE_TARGET,
        ),
        Figure("Allocate p99 ÷ echo p99", p99(ours) / p99(base), "x"),
        Figure(
            f"RSS after {ALLOCATES:,} Allocates (+{WARMUP} warm-up)",
            rss,
            "MiB",
            target=RSS_TARGET,
            baseline=echo_rss,
            baseline_label="echo, same calls",
        ),
        Figure(
            f"RSS after {ALLOCATES:,} Allocates over the echo's",
            rss - echo_rss,
            "MiB",
            target=RSS_OVER_ECHO,
        ),
    ]


async def _echo_push(run: Run) -> float:
    """The floor for list updates: the echo pushes its list again; time until the emulator has
    it (a bare stream message, no detection and no rebuild)."""
    endpoint = run.kubelet.endpoints[ECHO_RESOURCE]
    channel, target = stub(run.kubelet.directory / "echo.sock")
    samples = []
    async with channel:
        for _ in range(REPEATS):
            updates = endpoint.updates
            began = time.monotonic()
            await target.PreStartContainer(api_pb2.PreStartContainerRequest())
            seen = await run.until(_updated(endpoint, updates), "echo list push")
            samples.append(seen - began)
    return median(samples)


def _updated(endpoint: Endpoint, seen: int) -> Callable[[], bool]:
    return lambda: endpoint.updates > seen


def _unhealthy(kubelet: KubeletEmulator, resource: str, device: str) -> Callable[[], bool]:
    return lambda: not kubelet.devices(resource)[device].healthy


async def _xid(run: Run, push: float) -> Figure:
    """Append an Xid line for a MIG device; time until the kubelet lists it Unhealthy."""
    samples = []
    for device in sorted(run.kubelet.devices(MIG_RESOURCE))[:REPEATS]:
        began = time.monotonic()
        with run.events.open("a") as events:
            events.write(json.dumps({"uuid": device.split("::")[0], "xid": 94}) + "\n")
        seen = await run.until(_unhealthy(run.kubelet, MIG_RESOURCE, device), "Unhealthy")
        samples.append(seen - began)
    return Figure(
        "Xid line appended → Unhealthy at the kubelet",
        median(_ms(samples)),
        "ms",
        target=50.0,
        baseline=push * 1000,
        baseline_label="bare list push (echo)",
        samples=_ms(samples),
    )


async def _configmap(run: Run, push: float) -> Figure:
    """Swap the ConfigMap's `..data` from replicas 2 to 4; time until the kubelet has the new
    list. Swapped back (untimed) between repeats."""
    samples = []

    def gpus(count: int) -> Callable[[], bool]:
        return lambda: len(run.kubelet.devices("nvidia.com/gpu")) == count

    for _ in range(REPEATS):
        began = time.monotonic()
        swap_replicas(run.directory, 4)
        seen = await run.until(gpus(16), "replicas 4")
        samples.append(seen - began)
        swap_replicas(run.directory, 2)
        await run.until(gpus(8), "replicas 2")
    return Figure(
        "ConfigMap swap (replicas 2 → 4) → new list at the kubelet",
        median(_ms(samples)),
        "ms",
        target=500.0,
        baseline=push * 1000,
        baseline_label="bare list push (echo)",
        samples=_ms(samples),
    )


async def _kubelet_restart(run: Run) -> Figure:
    """Restart the emulator (stop, delete sockets, listen anew); time from the new kubelet.sock
    to every resource re-registered with its list. The floor is one Register round-trip
    (dial-back, options, first list) for an echo listening already."""
    samples = []
    for _ in range(REPEATS):
        await run.kubelet.stop()
        began = time.monotonic()
        await run.kubelet.start()
        seen = await run.until(run.registered(began), "re-registration")
        samples.append(seen - began)
    floor = []
    async with echo_server(run.kubelet, run.directory, "floor.sock", None):
        socket = run.kubelet.directory / "floor.sock"
        for _ in range(REPEATS):
            began = time.monotonic()
            await register(socket, ECHO_RESOURCE)
            seen = await run.until(registered(run.kubelet, {ECHO_RESOURCE: 0}, began), "echo")
            floor.append(seen - began)
    return Figure(
        "kubelet.sock re-created → every resource re-registered",
        median(_ms(samples)),
        "ms",
        target=500.0,
        baseline=median(_ms(floor)),
        baseline_label="one Register round-trip",
        samples=_ms(samples),
    )


# --- the large node -----------------------------------------------------------------------------


async def large_node_figures(root: Path) -> list[Figure]:
    """16 GPUs x 7 MIG x 16 replicas (start-up is in `startup`): preferred allocation of 8 and
    Allocate of 1 over gRPC, against the echo answering the same requests with the plugin's own
    answers."""
    async with running(root, "large-pref", large_node) as run:
        await run.until(run.registered(run.child.started), "registration")
        available = sorted(run.kubelet.devices(MIG_RESOURCE))
        preferred = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, allocation_size=PREFERRED_SIZE
                )
            ]
        )
        allocates = [
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[i])]
            )
            for i in available
        ]
        channel, plugin = stub(run.socket(MIG_RESOURCE))
        async with channel:
            answers = write_answers(
                run.directory / "answers",
                GetPreferredAllocation=await plugin.GetPreferredAllocation(preferred),
                Allocate=await plugin.Allocate(allocates[0]),
            )
            async with echo_server(run.kubelet, run.directory, "echo.sock", answers):
                echo_channel, echo = stub(run.kubelet.directory / "echo.sock")
                async with echo_channel:
                    chosen = await interleaved(
                        {
                            "plugin": lambda _i: plugin.GetPreferredAllocation(preferred),
                            "echo": lambda _i: echo.GetPreferredAllocation(preferred),
                        },
                        PREFERRED_CALLS,
                    )
                    allocated = await interleaved(
                        {
                            "plugin": lambda i: plugin.Allocate(allocates[i * 7 % len(allocates)]),
                            "echo": lambda i: echo.Allocate(allocates[i * 7 % len(allocates)]),
                        },
                        LARGE_ALLOCATES,
                    )
        rss = run.child.rss_bytes() / MIB
    ours, base = _ms(chosen["plugin"]), _ms(chosen["echo"])
    return [
        Figure(
            "1,792 IDs: preferred allocation of 8 over gRPC, median",
            median(ours),
            "ms",
            target=20.0,
            baseline=median(base),
            baseline_label="echo",
        ),
        Figure(
            "1,792 IDs: preferred allocation of 8 over gRPC, p99",
            p99(ours),
            "ms",
            target=20.0,
            baseline=p99(base),
            baseline_label="echo",
        ),
        Figure(
            "1,792 IDs: Allocate median ÷ echo median",
            median(allocated["plugin"]) / median(allocated["echo"]),
            "x",
            target=1.3,
        ),
        Figure("1,792 IDs: RSS after those calls", rss, "MiB"),
    ]
