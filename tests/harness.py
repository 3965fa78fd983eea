"""A running plugin for end-to-end tests: the real supervisor, servers and watchers on the
simulator, against the kubelet emulator, in a short temp dir (AF_UNIX paths stay < 108 bytes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deviceplugin.demos.plugin import SEED_CONFIG, write_configmap
from deviceplugin.ops.metrics import Metrics
from deviceplugin.plugin.service import run_supervisor
from deviceplugin.plugin.supervisor import Supervisor
from deviceplugin.runtime.options import ServeOptions
from deviceplugin.sim.hostroot import EVENTS_FILE
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.podresources import PodResourcesEmulator
from deviceplugin.sim.simulator import simulator_for

SEED = SEED_CONFIG
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"


@dataclass
class Plugin:
    root: Path
    kubelet: KubeletEmulator
    supervisor: Supervisor
    events: Path
    task: asyncio.Task[None]
    pods: PodResourcesEmulator | None = None  # the kubelet's PodResources, when asked for

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "k"

    @property
    def cdi_spec(self) -> Path:
        """Where the plugin writes its CDI spec (`--cdi-spec-dir` is `<root>/cdi`)."""
        return self.root / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json"

    def settled(self) -> bool:
        """Ready, and the kubelet has the first list of every resource it registered."""
        names = self.kubelet.resources()
        return (
            self.supervisor.status().ready
            and bool(names)
            and all(self.kubelet.endpoints[name].updates > 0 for name in names)
        )

    def event(self, **line: Any) -> None:
        with self.events.open("a") as file:
            file.write(json.dumps(line) + "\n")

    def swap_config(self, text: str) -> None:
        write_configmap(self.root / "cm", text)

    async def until(self, predicate: Any, timeout: float = 20.0) -> None:
        """Wait for a condition, woken by kubelet-visible changes and re-checked every 50 ms; the
        deadline is generous because a loaded machine (2 cores, several suites) is slow."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            assert loop.time() < deadline, "condition not met in time"
            await self.kubelet.wait_for(predicate, 0.05)


@contextlib.asynccontextmanager
async def running_plugin(
    simulate: str = "a100-80gb-x8-mixed",
    config_text: str = SEED.format(replicas=2),
    env: Mapping[str, str] | None = None,
    start_kubelet: bool = True,
    wait_registered: bool = True,
    recovery: str = "off",
    configmap: bool = True,
    kubelet_type: Callable[[Path], KubeletEmulator] = KubeletEmulator,
    cdi_spec_dir: Path | None = None,
    driver_root: Path | None = None,
    mps_check_seconds: float = 5.0,
    pod_resources: Callable[[PodResourcesEmulator], object] | None = None,
) -> AsyncIterator[Plugin]:
    """`kubelet_type` makes the emulator on the kubelet directory (a subclass can observe
    registrations); `cdi_spec_dir` replaces `<root>/cdi`. With `driver_root` (a sim-root tree),
    no `--simulate`: the production path on the simulated libnvidia-ml.so.1 there. With
    `pod_resources`, the kubelet's PodResources emulator serves before the plugin starts,
    reporting what `pod_resources` records in it."""
    root = Path(tempfile.mkdtemp(prefix="dpt"))
    kubelet = kubelet_type(root / "k")
    if start_kubelet:
        await kubelet.start()
    pods = None
    if pod_resources is not None:
        pods = PodResourcesEmulator(root)  # beside the kubelet directory, as on a node
        pod_resources(pods)
        await pods.start()
    if configmap:
        config = write_configmap(root / "cm", config_text)
    else:
        config = root / "cm" / "config.yaml"
        config.parent.mkdir()
        config.write_text(config_text)
    events = root / "ev.jsonl"
    events.touch()
    if driver_root is not None:
        events = driver_root / EVENTS_FILE
    settings = ServeOptions(
        kubelet_dir=root / "k",
        simulate=None if driver_root else simulate,
        simulate_events=None if driver_root else str(events),
        overrides={"nvidia_driver_root": str(driver_root)} if driver_root else {},
        config_file=str(config),
        health_recovery_after=recovery,
        cdi_spec_dir=cdi_spec_dir or root / "cdi",
        env=dict(env or {}),
    )
    supervisor = Supervisor(
        settings, Metrics(), simulator_for(settings.simulate), mps_check_seconds=mps_check_seconds
    )
    task = asyncio.get_running_loop().create_task(run_supervisor(supervisor))
    plugin = Plugin(root, kubelet, supervisor, events, task, pods)
    try:
        if wait_registered:
            await plugin.until(lambda: plugin.settled() or task.done(), timeout=10)
            if task.done():
                task.result()
        yield plugin
    finally:
        supervisor.engine.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        if pods is not None:
            await pods.stop()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(coro: Any) -> Any:
    """Run one async test body in a fresh loop."""
    return asyncio.run(coro)


def inotify_descriptors() -> int:
    """How many inotify descriptors this process holds open."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
            count += "inotify" in os.readlink(f"/proc/self/fd/{name}")
    return count
