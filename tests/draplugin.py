"""A running DRA driver for the kubelet-side tests: the real `DraDriver` on a simulated node,
the API-server stand-in reached through a kubeconfig file, and the plugin-watcher emulator on
the real sockets, all in a short temp dir (AF_UNIX paths stay under 108 bytes). Also ResourceClaims
as the scheduler leaves them, and a CDI resolver that reads the spec files as a runtime does."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deviceplugin.cli import SERVE_ENV_VARS
from deviceplugin.dra.driver import DraDriver
from deviceplugin.model.cdi import VALID_VERSIONS, minimum_cdi_version
from deviceplugin.model.memoryshares import GpuSharing
from deviceplugin.model.migpartitions import MigMode
from deviceplugin.runtime.options import DraServeOptions
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.hostroot import EVENTS_FILE, install_library, lay_out
from deviceplugin.sim.libbuild import library_path
from deviceplugin.sim.node import read_node, resolve_node_path
from deviceplugin.sim.pluginwatcher import PluginWatcher
from deviceplugin.sim.simulator import simulator_for

DRIVER = "gpu.nvidia.com"
NODE = "node-1"
PRESET = "a100-80gb-x8-mixed"
_VENDOR = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*[A-Za-z0-9]")
_CLASS = re.compile(r"[A-Za-z][A-Za-z0-9_-]*[A-Za-z0-9]")
_DEVICE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


def short_dir(prefix: str = "dra") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


_HOSTS: dict[str, Path] = {}


def host_tree(simulate: str) -> Path:
    """The simulated node's host files, laid out once per test run (a thousand device nodes
    take most of a second), as `deviceplugin sim-root` would."""
    if simulate not in _HOSTS:
        root = short_dir("drahost")
        atexit.register(shutil.rmtree, root, True)
        lay_out(read_node(resolve_node_path(simulate)), root)
        _HOSTS[simulate] = root
    return _HOSTS[simulate]


def library_tree(simulate: str) -> Path:
    """A fresh driver root with the simulated libnvidia-ml.so.1 (its state, such as a lost GPU,
    lives as long as the process, so each test gets its own copy), as `sim-root` makes it."""
    root = short_dir("drasim")
    atexit.register(shutil.rmtree, root, True)
    node = read_node(resolve_node_path(simulate))
    lay_out(node, root, every_instance=False)
    install_library(node, root, library_path())
    return root


def write_kubeconfig(path: Path, url: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stand-in", "cluster": {"server": url}}],
        "users": [{"name": "driver", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "here", "context": {"cluster": "stand-in", "user": "driver"}}],
        "current-context": "here",
    }
    path.write_text(json.dumps(config))
    return path


async def start_serve(
    root: Path, url: str, kubelet: Path, *args: str, **env: str
) -> asyncio.subprocess.Process:
    """`deviceplugin dra serve --simulate PRESET` as a child process, as a node runs it: pointed
    at the stand-in at `url` (a kubeconfig in `root`), the kubelet root and `root/cdi`, with
    none of the serve settings of this process's environment but `env`; stderr piped."""
    clean = {k: v for k, v in os.environ.items() if k not in SERVE_ENV_VARS}
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "deviceplugin", "dra", "serve", "--simulate", PRESET),
        *("--node-name", NODE, "--kubelet-root", str(kubelet)),
        *("--kubeconfig", str(write_kubeconfig(root / "kubeconfig", url))),
        *("--cdi-spec-dir", str(root / "cdi"), *args),
        env={**clean, **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


def claim(
    name: str,
    devices: Sequence[tuple[str, str]],
    namespace: str = "default",
    driver: str = DRIVER,
    pool: str = NODE,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim, allocated `devices` as (request, device name) pairs unless not
    `allocated`."""
    requests = sorted({request for request, _ in devices}) or ["gpu"]
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": "gpu.nvidia.com"}} for r in requests
                ]
            }
        },
    }
    if allocated:
        results = [{"request": r, "driver": driver, "pool": pool, "device": d} for r, d in devices]
        body["status"] = {"allocation": {"devices": {"results": results}}}
    return body


def with_admin_access(body: dict[str, Any]) -> dict[str, Any]:
    """`body` (from `claim`) asking admin access in its spec's requests and given it in every
    allocation result, as the scheduler leaves such a claim."""
    for request in body["spec"]["devices"]["requests"]:
        request["exactly"]["adminAccess"] = True
    for result in body["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = True
    return body


def published(server: ApiServer, node: str = NODE) -> dict[str, dict[str, Any]]:
    """Device name -> device, over the node's slices on the stand-in."""
    return {
        d["name"]: d
        for s in server.slices.values()
        if s["spec"]["nodeName"] == node
        for d in s["spec"].get("devices") or []
    }


def resolve(cdi_dir: Path, qualified: str) -> dict[str, Any]:
    """The device a runtime would inject for `vendor/class=name`, read from every spec in the
    directory; AssertionError on an invalid spec, an unknown name or a name defined twice. The
    result holds the device's own edits merged after the spec's common ones."""
    kind, _, name = qualified.partition("=")
    found = []
    for path in sorted(cdi_dir.glob("*.json")):
        spec = json.loads(path.read_text())
        vendor, _, klass = spec["kind"].partition("/")
        assert _VENDOR.fullmatch(vendor) and _CLASS.fullmatch(klass), spec["kind"]
        assert spec["cdiVersion"] in VALID_VERSIONS
        assert VALID_VERSIONS.index(spec["cdiVersion"]) >= VALID_VERSIONS.index(
            minimum_cdi_version(spec)
        )
        for device in spec["devices"]:
            assert _DEVICE.fullmatch(device["name"]), device["name"]
            if spec["kind"] == kind and device["name"] == name:
                found.append((spec, device))
    assert len(found) == 1, f"{qualified}: defined {len(found)} times in {cdi_dir}"
    spec, device = found[0]
    common = spec.get("containerEdits") or {}
    own = device["containerEdits"]
    return {
        "deviceNodes": [*common.get("deviceNodes", []), *own.get("deviceNodes", [])],
        "mounts": [*common.get("mounts", []), *own.get("mounts", [])],
        "env": [*common.get("env", []), *own.get("env", [])],
    }


@dataclass
class Node:
    root: Path
    server: ApiServer
    watcher: PluginWatcher
    settings: DraServeOptions
    driver: DraDriver
    events: Path
    stopped: list[DraDriver] = field(default_factory=list)

    @property
    def cdi_dir(self) -> Path:
        return self.settings.cdi_spec_dir

    @property
    def kubelet_root(self) -> Path:
        return self.settings.kubelet_root

    def event(self, **line: Any) -> None:
        with self.events.open("a") as file:
            file.write(json.dumps(line) + "\n")

    def add_claim(self, body: dict[str, Any]) -> tuple[str, str, str]:
        """Store the claim on the stand-in; (namespace, name, uid) as the kubelet names it."""
        meta = self.server.add_claim(body)["metadata"]
        return meta["namespace"], meta["name"], meta["uid"]

    async def restart(self) -> None:
        """Stop the driver (sockets removed) and start a new one with the same settings; with the
        watcher running, return once it has registered the new one, so that the calls that
        follow reach it and not the channel of the old one, closed at the watcher's next poll."""
        previous = self.watcher.plugins.get(DRIVER)
        await self.driver.stop()
        self.stopped.append(self.driver)
        self.driver = DraDriver(self.settings, simulator=simulator_for(self.settings.simulate))
        await self.driver.start()
        if self.driver.publisher is not None:
            await asyncio.wait_for(self.driver.wait_probed(), 30)
            await asyncio.wait_for(self.driver.publisher.wait_published(), 30)
        if self.watcher.watching and self.driver.dra is not None:
            await self.watcher.wait_registered(DRIVER, 30, replacing=previous)

    async def synced(self) -> None:
        """Wait until the publisher's task has written the newest state."""
        assert self.driver.publisher is not None
        await asyncio.wait_for(self.driver.publisher.wait_published(), 10)

    async def until(self, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
        """Poll every 10 ms; AssertionError when it does not happen."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        while not predicate():
            assert loop.time() - began < timeout, "condition not met in time"
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running_driver(
    simulate: str = PRESET,
    overrides: Mapping[str, str | None] | None = None,
    recovery: str = "off",
    watcher: bool = True,
    library: bool = False,
    gpu_sharing: GpuSharing = "off",
    mig_mode: MigMode = "static",
    mps_shared_namespaces: tuple[tuple[str, ...], ...] = (),
    kubernetes: str | None = None,
) -> AsyncIterator[Node]:
    """The driver started and (with `watcher`) registered, its first slices published and the
    API server probed. With `library`, no `--simulate`: the production path on the simulated
    libnvidia-ml.so.1. `kubernetes` ("1.35"): the stand-in answers as that release with its
    default feature gates (`ApiServer.emulate`)."""
    root = short_dir()
    server = ApiServer()
    if kubernetes is not None:
        server.emulate(kubernetes)
    await server.start()
    events = root / "events.jsonl"
    events.touch()
    driver_root = library_tree(simulate) if library else host_tree(simulate)
    if library:
        events = driver_root / EVENTS_FILE
    settings = DraServeOptions(
        simulate=None if library else simulate,
        simulate_events=None if library else str(events),
        health_recovery_after=recovery,
        cdi_spec_dir=root / "cdi",
        overrides={
            "nvidia_driver_root": str(driver_root),
            **(overrides or {}),
        },
        driver_name=DRIVER,
        kubelet_root=root / "kubelet",
        kubeconfig=str(write_kubeconfig(root / "kubeconfig", server.url)),
        node_name=NODE,
        gpu_sharing=gpu_sharing,
        mig_mode=mig_mode,
        mps_shared_namespaces=mps_shared_namespaces,
    )
    emulator = PluginWatcher(settings.kubelet_root)
    driver = DraDriver(settings, simulator=simulator_for(settings.simulate))
    node = Node(root, server, emulator, settings, driver, events)
    try:
        await node.driver.start()
        if node.driver.publisher is not None:
            await asyncio.wait_for(node.driver.wait_probed(), 30)
            await asyncio.wait_for(node.driver.publisher.wait_published(), 30)
        if watcher:
            await emulator.start()
            await emulator.wait_registered(DRIVER)
        yield node
    finally:
        await emulator.stop()
        await node.driver.stop()
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(body: Callable[[], Any]) -> None:
    asyncio.run(body())
