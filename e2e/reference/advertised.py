"""What a device plugin advertises to the kubelet, read through our kubelet emulator and reduced
to plain, comparable data: resources, devices with health and topology, options, Allocate
answers for one, two and all IDs, and preferred allocations for a few requests; with MPS, what
its control daemons were told (mpsstate.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from deviceplugin.sim.hostroot import COMPUTE_MODE_FILE
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2
from e2e.reference.mpsstate import mps_state
from testbed import plugins
from testbed.process import Child

REGISTER_TIMEOUT = 20.0
QUIET_SECONDS = 0.4  # no new registration for this long: every resource has registered

Plain = dict[str, Any]
T = TypeVar("T")
CDI_KEY_ID = re.compile(r"^(cdi\.k8s\.io/[^_]+_).+$")


@dataclass
class Advertised:
    """One plugin's answers on one case. `failed` says why it never served (then all else is
    empty): both plugins refusing the same input agree."""

    resources: dict[str, Plain] = field(default_factory=dict)
    mps: Plain = field(default_factory=dict)
    failed: str = ""


@dataclass(frozen=True)
class MpsNode:
    """Where a run's MPS control daemons live: the mps root both plugins are configured with,
    and the driver root whose simulated NVML keeps the compute modes."""

    mps_root: Path
    driver_root: Path


def container_response(response: api_pb2.ContainerAllocateResponse) -> Plain:
    """One container's Allocate answer, in an order-free form. A CDI annotation key ends in
    an ID unique to the response (the reference draws a random one), shown as `<id>`."""
    return {
        "envs": dict(response.envs),
        "mounts": sorted([m.container_path, m.host_path, m.read_only] for m in response.mounts),
        "devices": sorted([d.container_path, d.host_path, d.permissions] for d in response.devices),
        "annotations": {
            CDI_KEY_ID.sub(r"\1<id>", key): value for key, value in response.annotations.items()
        },
        "cdi_devices": sorted(device.name for device in response.cdi_devices),
    }


def options(message: api_pb2.DevicePluginOptions) -> Plain:
    return {
        "pre_start_required": message.pre_start_required,
        "get_preferred_allocation_available": message.get_preferred_allocation_available,
    }


def allocation_requests(ids: list[str]) -> dict[str, list[str]]:
    """One, two and all of the IDs (sorted), as the kubelet might ask."""
    requests = {"one": ids[:1], "all": ids}
    if len(ids) >= 2:
        requests["two"] = ids[:2]
    return requests


def preferred_requests(ids: list[str]) -> dict[str, tuple[list[str], int]]:
    """A few GetPreferredAllocation requests: (must include, size) over all IDs."""
    requests: dict[str, tuple[list[str], int]] = {}
    for size in (2, 4):
        if len(ids) > size:
            requests[f"{size} of {len(ids)}"] = ([], size)
    if len(ids) > 2:
        requests[f"2 of {len(ids)} including the last"] = ([ids[-1]], 2)
    return requests


def valid_preference(chosen: list[str], available: list[str], must: list[str], size: int) -> bool:
    """What the kubelet needs of an answer: `size` distinct available IDs, the required ones
    among them."""
    return (
        len(chosen) == size == len(set(chosen))
        and set(chosen) <= set(available)
        and set(must) <= set(chosen)
    )


def _error(exc: grpc.aio.AioRpcError) -> str:
    return f"error {exc.code().name}"


async def _resource(kubelet: KubeletEmulator, resource: str) -> Plain:
    devices = kubelet.devices(resource)
    ids = sorted(devices)
    endpoint = kubelet.endpoints[resource]
    answers: Plain = {
        "devices": {
            device_id: {"health": device.health, "numa": list(device.numa_nodes)}
            for device_id, device in devices.items()
        },
        "options": options(endpoint.options),
        "allocate": {},
        "preferred": {},
    }
    for label, request in allocation_requests(ids).items():
        try:
            response = await kubelet.allocate(resource, [request])
            answers["allocate"][label] = container_response(response.container_responses[0])
        except grpc.aio.AioRpcError as exc:
            answers["allocate"][label] = _error(exc)
    if endpoint.options.get_preferred_allocation_available:
        for label, (must, size) in preferred_requests(ids).items():
            try:
                chosen = await kubelet.preferred(resource, ids, must, size)
                answers["preferred"][label] = {
                    "ids": sorted(chosen),  # a set to the kubelet
                    "valid": valid_preference(chosen, ids, must, size),
                }
            except grpc.aio.AioRpcError as exc:
                answers["preferred"][label] = _error(exc)
    return answers


async def wait_registered(kubelet: KubeletEmulator, plugin: Child) -> str:
    """Wait until the plugin has registered every resource it will and each has sent its
    first device list; returns why not ("" when it did)."""
    deadline = time.monotonic() + REGISTER_TIMEOUT
    last_change, seen = time.monotonic(), -1
    while time.monotonic() < deadline:
        code = plugin.exit_code()
        if code is not None:
            return f"exited with status {code}: {plugin.tail(6)}"
        count = len(kubelet.registrations)
        if count != seen:
            seen, last_change = count, time.monotonic()
        listed = all(endpoint.updates for endpoint in kubelet.endpoints.values())
        if kubelet.endpoints and listed and time.monotonic() - last_change >= QUIET_SECONDS:
            return ""
        await asyncio.sleep(0.05)
    if not kubelet.endpoints:
        return f"registered nothing in {REGISTER_TIMEOUT:.0f} s: {plugin.tail(6)}"
    return f"a resource sent no device list in {REGISTER_TIMEOUT:.0f} s"


async def advertised(
    kubelet: KubeletEmulator, plugin: Child, mps: MpsNode | None = None
) -> Advertised:
    """Start `plugin`, read everything it advertises through `kubelet` (and with `mps`, what
    its daemons were told by the time it has registered), stop it."""
    with plugin.start():
        failed = await wait_registered(kubelet, plugin)
        if failed:
            return Advertised(failed=failed)
        refused = [r for r in kubelet.registrations if not r.ok]
        if refused:
            return Advertised(failed=f"registration refused: {refused[0].error}")
        daemons = mps_state(mps.mps_root, mps.driver_root) if mps else {}
        resources = {name: await _resource(kubelet, name) for name in kubelet.resources()}
        return Advertised(resources=resources, mps=daemons)


async def reference_mps_ready(daemon: Child, mps_root: Path) -> str:
    """Wait for NVIDIA's MPS daemon to have started its control daemons (`.ready`); returns
    why not ("" when it has). Its plugin advertises an MPS resource only once they answer."""
    deadline = time.monotonic() + REGISTER_TIMEOUT
    while time.monotonic() < deadline:
        if (mps_root / plugins.MPS_READY).exists():
            return ""
        code = daemon.exit_code()
        if code is not None:
            return f"MPS daemon exited with status {code}: {daemon.tail(6)}"
        await asyncio.sleep(0.05)
    return f"MPS daemon not ready in {REGISTER_TIMEOUT:.0f} s: {daemon.tail(6)}"


async def in_turn(
    binaries: Path,
    root: Path,
    config: Path,
    work: Path,
    observe: Callable[[KubeletEmulator, Child], Awaitable[T]],
    ours_extra: Sequence[str] = (),
    mps_root: Path | None = None,
    stopped: Callable[[str], None] | None = None,
) -> dict[str, T]:
    """The reference, then ours, each on driver root `root` with `config` against a fresh
    kubelet emulator under `work/<name>`: what `observe` makes of each. With `mps_root` (the
    config's `flags.mpsRoot`, emptied before each), NVIDIA's MPS daemon runs beside its plugin,
    started first as its chart starts it; ours starts its daemons itself. `stopped(name)` is
    called once each run's processes have all ended."""
    results: dict[str, T] = {}
    for name in ("reference", "ours"):
        run = work / name
        shutil.rmtree(run, ignore_errors=True)
        (run / "cdi").mkdir(parents=True)
        if mps_root is not None:  # no daemon's files or compute modes left from the last run
            shutil.rmtree(mps_root, ignore_errors=True)
            mps_root.mkdir(parents=True)
            (root / COMPUTE_MODE_FILE).unlink(missing_ok=True)
        kubelet = KubeletEmulator(run / "kubelet")
        await kubelet.start()
        try:
            with contextlib.ExitStack() as stack:
                log = run / "plugin.log"
                if name == "reference":
                    if mps_root is not None:
                        daemon = plugins.reference_mps_daemon(
                            binaries, root, config, mps_root, run / "mps-daemon.log"
                        )
                        stack.enter_context(daemon.start())
                        await reference_mps_ready(daemon, mps_root)  # else its plugin says why
                    plugin = plugins.reference(
                        binaries, root, kubelet.directory, config, log, mps_root
                    )
                else:
                    plugin = plugins.ours(
                        root, kubelet.directory, config, run / "cdi", log, ours_extra
                    )
                results[name] = await observe(kubelet, plugin)
            if stopped is not None:
                stopped(name)
        finally:
            await kubelet.stop()
    return results
