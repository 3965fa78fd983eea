"""The node engine's serialized path: a reload that races a rediscovery never leaves Prepare or
ListAndWatch on the config it replaced, and shutdown comes after the change in flight.

Each test forces the interleaving with the real daemon: a rediscovery is held inside its work
(the host scan that builds Prepare's devices, the plan that builds the advertised resources)
on a threading.Event while a new config is reloaded; then it is let go, and what the daemon
serves must come from the new config.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.dra import driver as dra_driver
from deviceplugin.dra.driver import DraDriver
from deviceplugin.ops.metrics import NoMetrics
from deviceplugin.plugin import supervisor as plugin_supervisor
from deviceplugin.runtime import engine as engine_module
from deviceplugin.runtime.engine import NodeEngine
from deviceplugin.runtime.options import DraServeOptions, EngineOptions
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.hostroot import lay_out
from deviceplugin.sim.node import PRESETS_DIR, read_node
from deviceplugin.sim.simulator import NodeSimulator
from tests.draplugin import DRIVER, NODE, short_dir, write_kubeconfig
from tests.harness import GPU, SEED, running_plugin
from tests.simnode import gpu as simgpu
from tests.simnode import migs, write_node
from tests.test_lifecycle import recut

HELD_SECONDS = 0.3  # how long the reload gets to overtake the held rediscovery


class Hold:
    """Wraps a function run off the loop: the first call after `arm()` waits in its thread
    until `release()`; `entered` says it got there."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self._release = threading.Event()
        self._armed = False

    def arm(self) -> None:
        self._armed = True

    def release(self) -> None:
        self._release.set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._armed:
            self._armed = False
            self.entered.set()
            self._release.wait(10)
        return self.real(*args, **kwargs)


def dra_config(driver_root: Path, dev_root: Path) -> str:
    return f"version: v1\nflags:\n  nvidiaDriverRoot: {driver_root}\n  nvidiaDevRoot: {dev_root}\n"


def test_a_reload_racing_a_rediscovery_leaves_prepare_on_the_new_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = short_dir("draeng")
    node_file = write_node(
        root / "node.yaml", [simgpu(0), simgpu(1, **migs(1, "1g.10gb", "1g.10gb"))]
    )
    host, other = root / "host", root / "other"
    for tree in (host, other):
        lay_out(read_node(node_file), tree)
    config = root / "config.yaml"
    config.write_text(dra_config(host, host))
    hold = Hold(dra_driver.scan_host)
    monkeypatch.setattr(dra_driver, "scan_host", hold)

    async def body() -> None:
        server = ApiServer()
        await server.start()
        events = root / "events.jsonl"
        events.touch()
        driver = DraDriver(
            DraServeOptions(
                config_file=str(config),
                simulate_events=str(events),
                health_recovery_after="off",
                cdi_spec_dir=root / "cdi",
                driver_name=DRIVER,
                kubelet_root=root / "kubelet",
                kubeconfig=str(write_kubeconfig(root / "kubeconfig", server.url)),
                node_name=NODE,
            ),
            simulator=NodeSimulator(str(node_file)),
        )
        try:
            await driver.start()
            assert driver.preparer is not None
            assert driver.preparer.devices.options.dev_root == str(host)
            write_node(node_file, [simgpu(0), simgpu(1, **migs(1, *["1g.10gb"] * 3))])
            hold.arm()
            rediscovery = asyncio.create_task(driver.rediscover())
            assert await asyncio.to_thread(hold.entered.wait, 5)  # scanning, old config read
            config.write_text(dra_config(host, other))
            reload = asyncio.create_task(driver.reload("SIGHUP", force=True))
            await asyncio.sleep(HELD_SECONDS)
            assert not reload.done(), "a reload overtook a rediscovery in flight"
            hold.release()
            assert await rediscovery is True
            assert await reload is True
            devices = driver.preparer.devices
            assert devices.options.dev_root == str(other), "Prepare kept the replaced config"
            assert sum("-mig-" in name for name in devices.by_name) == 3
        finally:
            hold.release()
            await driver.stop()
            await server.stop()

    try:
        asyncio.run(body())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_reload_racing_a_rediscovery_leaves_list_and_watch_on_the_new_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node_file = tmp_path / "node.yaml"
    shutil.copy(PRESETS_DIR / "a100-80gb-x8-mixed.yaml", node_file)
    hold = Hold(plugin_supervisor.build_plan)
    monkeypatch.setattr(plugin_supervisor, "build_plan", hold)

    async def body() -> None:
        async with running_plugin(simulate=str(node_file), configmap=False) as plugin:
            kubelet = plugin.kubelet
            assert kubelet.allocatable(GPU) == 4 * 2
            config = Path(plugin.supervisor.engine.config_file.path or "")
            recut(node_file, {0: ["3g.40gb", "3g.40gb"]})
            hold.arm()
            rediscovery = asyncio.create_task(plugin.supervisor.rediscover())
            assert await asyncio.to_thread(hold.entered.wait, 5)  # planning from the old config
            config.write_text(SEED.format(replicas=3))
            reload = asyncio.create_task(plugin.supervisor.reload("SIGHUP", force=True))
            await asyncio.sleep(HELD_SECONDS)
            assert not reload.done(), "a reload overtook a rediscovery in flight"
            hold.release()
            assert await rediscovery is True
            assert await reload is True
            assert len(plugin.supervisor.resources[GPU].devices) == 4 * 3
            await plugin.until(lambda: kubelet.allocatable(GPU) == 4 * 3)
            await plugin.until(lambda: kubelet.allocatable("nvidia.com/mig-3g.40gb") == 2)

    asyncio.run(body())


def test_shutdown_waits_for_the_change_in_flight() -> None:
    done: list[str] = []

    async def body() -> None:
        engine = NodeEngine(EngineOptions(), NoMetrics())

        async def change() -> None:
            await asyncio.sleep(0.05)
            done.append("change")

        async def stop() -> None:
            done.append("stop")

        running = asyncio.create_task(engine.change(change, None))
        await asyncio.sleep(0)
        await engine.shutdown(stop)
        await running
        assert await engine.change(change, "stopped") == "stopped"

    asyncio.run(body())
    assert done == ["change", "stop"]


def test_shutdown_does_not_wait_for_a_stuck_change(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(engine_module, "SHUTDOWN_WAIT_SECONDS", 0.05)
    stopped: list[bool] = []

    async def body() -> None:
        engine = NodeEngine(EngineOptions(), NoMetrics())
        stuck = asyncio.Event()

        async def stop() -> None:
            stopped.append(True)

        running = asyncio.create_task(engine.change(stuck.wait, None))
        await asyncio.sleep(0)
        await engine.shutdown(stop)
        running.cancel()

    asyncio.run(body())
    assert stopped == [True]
    assert "shutdown.change_pending" in caplog.text
