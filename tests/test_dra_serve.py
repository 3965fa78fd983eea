"""`deviceplugin dra serve --simulate` as a process, as a node runs it: it registers with the
plugin-watcher emulator, publishes the hardware as it is to the API-server stand-in named by a
kubeconfig file (whatever the device plugin's MIG_STRATEGY says), prepares a claim, taints a
device an Xid takes away with the effect asked for, and on SIGTERM exits 0 with both sockets
removed; a --kubelet-root too long for an MPS control socket exits 2 where MPS can run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_sim_library import sim_root

from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.pluginwatcher import PluginWatcher
from tests.draplugin import (
    DRIVER,
    PRESET,
    claim,
    published,
    resolve,
    short_dir,
    start_serve,
)

START_TIMEOUT = 30.0  # a loaded CI machine; an idle one needs about 2 s


@contextlib.asynccontextmanager
async def serving(
    root: Path, kubelet: Path, *args: str, **env: str
) -> AsyncIterator[tuple[ApiServer, PluginWatcher, asyncio.subprocess.Process]]:
    """`dra serve` (start_serve) beside an API-server stand-in and the plugin watcher on
    `kubelet`; on the way out the process is killed if it still runs and `root` removed."""
    server = ApiServer()
    await server.start()
    watcher = PluginWatcher(kubelet)
    await watcher.start()
    try:
        process = await start_serve(root, server.url, kubelet, *args, **env)
        try:
            yield server, watcher, process
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    finally:
        await watcher.stop()
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_dra_serve_registers_publishes_prepares_and_stops_cleanly_on_sigterm() -> None:
    async def body() -> None:
        root = short_dir()
        kubelet = root / "kubelet"
        events = root / "events.jsonl"
        events.touch()
        async with serving(
            root,
            kubelet,
            "--simulate-events",
            str(events),
            MIG_STRATEGY="none",  # the device plugin's setting: no say over DRA
            DP_DRA_UNHEALTHY_TAINT="NoExecute",
        ) as (server, watcher, process):
            plugin = await watcher.wait_registered(DRIVER, START_TIMEOUT)
            devices = published(server)
            assert len(devices) == 32 and server.rejected == []  # 4 GPUs + 28 MIG devices
            stored = server.add_claim(claim("e2e", [("gpu", "gpu-4")]))["metadata"]
            ref = ("default", "e2e", stored["uid"])
            response = await watcher.prepare(DRIVER, [ref])
            (device,) = response.claims[ref[2]].devices
            (cdi_id,) = device.cdi_device_ids
            nodes = [n["path"] for n in resolve(root / "cdi", cdi_id)["deviceNodes"]]
            assert "/dev/nvidia4" in nodes

            uuid = devices["gpu-0-mig-7-0"]["attributes"]["uuid"]["string"]
            with events.open("a") as file:
                file.write(json.dumps({"uuid": uuid, "xid": 94}) + "\n")
            async with asyncio.timeout(START_TIMEOUT):
                # left out meanwhile if the Xid comes before the probe says taints are kept
                while "taints" not in published(server).get("gpu-0-mig-7-0", {}):
                    await asyncio.sleep(0.05)
            (taint,) = published(server)["gpu-0-mig-7-0"]["taints"]
            assert taint == {
                "key": "gpu.nvidia.com/unhealthy",
                "value": "xid-94",
                "effect": "NoExecute",
            }

            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 15)
            assert process.stderr is not None
            log = (await process.stderr.read()).decode()
            assert code == 0, log
            assert not (kubelet / "plugins" / DRIVER / "dra.sock").exists()
            assert not plugin.socket.exists()
            await watcher.wait_deregistered(DRIVER)
            assert "dra.stopped" in log

    asyncio.run(body())


@pytest.mark.parametrize("mps", [True, False], ids=["mps-control", "no-mps-control"])
def test_a_kubelet_root_too_long_for_an_mps_control_socket_exits_2_naming_it(mps: bool) -> None:
    """The driver's own sockets fit; `<root>/plugins/<driver>/mps/<device>/pipe/control` for
    the longest published device name does not. A driver root with no MPS control program runs
    no daemon, so there the root serves."""

    async def body() -> None:
        root = short_dir()
        kubelet = root / "k".ljust(62 - len(str(root)), "k")  # 62 bytes: dra.sock fits in 95
        env = {"NVIDIA_DRIVER_ROOT": str(sim_root(PRESET, root / "driver"))} if mps else {}
        async with serving(root, kubelet, **env) as (_, watcher, process):
            if not mps:
                await watcher.wait_registered(DRIVER, START_TIMEOUT)
                return
            code = await asyncio.wait_for(process.wait(), START_TIMEOUT)
            assert process.stderr is not None
            log = (await process.stderr.read()).decode()
            assert code == 2, log
            assert "--kubelet-root / DP_KUBELET_ROOT: too long for the MPS control socket" in log
            assert "bytes long; a unix socket path holds at most 107" in log, log

    asyncio.run(body())
