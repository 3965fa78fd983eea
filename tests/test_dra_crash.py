"""A `dra serve --simulate` process killed in the middle of Prepare or Unprepare (a failpoint:
`DP_FAILPOINT`, exit status 75) and started again: the kubelet's retry, over the real sockets of
the plugin-watcher emulator, leaves the claim prepared exactly once, or unprepared with no file
of it left behind."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from suites import first_quick

from deviceplugin.dra.checkpoint import read_boot_id
from deviceplugin.dra.failpoints import (
    EXIT_STATUS,
    PREPARE_AFTER_CDI_SPEC,
    PREPARE_AFTER_CHECKPOINT,
    UNPREPARE_AFTER_CDI_SPEC_REMOVED,
)
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.pluginwatcher import PluginWatcher
from tests.draplugin import DRIVER, claim, resolve, short_dir, start_serve

TIMEOUT = 30.0  # a loaded CI machine; an idle one starts the driver in about 2 s
DEVICE = "gpu-4"


@dataclass
class Node:
    root: Path
    server: ApiServer
    watcher: PluginWatcher
    process: asyncio.subprocess.Process | None = None

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    def checkpoint(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(
            (self.kubelet / "plugins" / DRIVER / "checkpoint.json").read_text()
        )["data"]
        return data

    def files(self) -> list[str]:
        """Every file in the CDI directory and the driver's own, but its sockets and lock."""
        kept = ("dra.sock", "checkpoint.json", "checkpoint.lock")
        found = [p for p in (*self.cdi.glob("*"), *(self.kubelet / "plugins" / DRIVER).glob("*"))]
        return sorted(p.name for p in found if p.name not in kept)

    async def serve(self, **env: str) -> asyncio.subprocess.Process:
        """`dra serve --simulate` for this node, not yet registered."""
        return await start_serve(self.root, self.server.url, self.kubelet, **env)

    async def start(self, **env: str) -> None:
        """A driver process, registered with the emulator (again, after a crash)."""
        registered = len([a for a in self.watcher.attempts if a.ok])
        self.process = await self.serve(**env)
        await until(lambda: len([a for a in self.watcher.attempts if a.ok]) > registered)
        await self.watcher.wait_registered(DRIVER, TIMEOUT)

    async def crashed(self) -> int:
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), TIMEOUT)
        assert self.process.stderr is not None
        log = (await self.process.stderr.read()).decode()
        assert code == EXIT_STATUS, log
        assert "dra.failpoint.reached" in log
        return code


async def until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not predicate():
            await asyncio.sleep(0.02)


N = TypeVar("N", bound=Node)


@asynccontextmanager
async def node(make: Callable[[Path, ApiServer, PluginWatcher], N]) -> AsyncIterator[N]:
    """A node made by `make` (`Node`, or one serving another way), its processes killed and its
    files removed at the end."""
    root = short_dir()
    server = ApiServer()
    await server.start()
    watcher = PluginWatcher(root / "kubelet")
    await watcher.start()
    here = make(root, server, watcher)
    try:
        yield here
    finally:
        if here.process is not None and here.process.returncode is None:
            here.process.kill()
            await here.process.wait()
        await watcher.stop()
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("point", first_quick([PREPARE_AFTER_CDI_SPEC, PREPARE_AFTER_CHECKPOINT]))
def test_a_driver_killed_during_prepare_prepares_the_claim_once_on_the_retry(point: str) -> None:
    async def body() -> None:
        async with node(Node) as here:
            await here.start(DP_FAILPOINT=point)
            uid = here.server.add_claim(claim("crash", [("gpu", DEVICE)]))["metadata"]["uid"]
            ref = ("default", "crash", uid)
            with pytest.raises(grpc.aio.AioRpcError):
                await here.watcher.prepare(DRIVER, [ref])
            await here.crashed()
            spec = f"k8s.gpu.nvidia.com-claim_{uid}.json"
            state = {PREPARE_AFTER_CDI_SPEC: "PrepareStarted"}.get(point, "PrepareCompleted")
            assert here.checkpoint()["claims"][uid]["state"] == state
            assert (here.cdi / spec).is_file()

            await here.start()
            if point == PREPARE_AFTER_CDI_SPEC:  # rolled back at start-up
                assert uid not in here.checkpoint()["claims"]
                assert not (here.cdi / spec).exists()
            response = await here.watcher.prepare(DRIVER, [ref])
            entry = response.claims[uid]
            assert entry.error == ""
            (device,) = entry.devices
            assert device.device_name == DEVICE
            (cdi_id,) = device.cdi_device_ids
            assert "/dev/nvidia4" in [n["path"] for n in resolve(here.cdi, cdi_id)["deviceNodes"]]
            saved = here.checkpoint()
            assert list(saved["claims"]) == [uid]
            assert saved["claims"][uid]["state"] == "PrepareCompleted"
            assert saved["bootID"] == read_boot_id()
            assert here.files() == [spec]

            await here.watcher.unprepare(DRIVER, [ref])
            assert here.files() == [] and here.checkpoint()["claims"] == {}

    asyncio.run(body())


def test_a_driver_killed_during_unprepare_finishes_it_on_the_retry() -> None:
    async def body() -> None:
        async with node(Node) as here:
            await here.start(DP_FAILPOINT=UNPREPARE_AFTER_CDI_SPEC_REMOVED)
            uid = here.server.add_claim(claim("crash", [("gpu", DEVICE)]))["metadata"]["uid"]
            ref = ("default", "crash", uid)
            assert (await here.watcher.prepare(DRIVER, [ref])).claims[uid].error == ""
            with pytest.raises(grpc.aio.AioRpcError):
                await here.watcher.unprepare(DRIVER, [ref])
            await here.crashed()
            assert here.files() == []
            assert here.checkpoint()["claims"][uid]["state"] == "PrepareCompleted"

            await here.start()
            response = await here.watcher.unprepare(DRIVER, [ref])
            assert response.claims[uid].error == ""
            assert here.files() == [] and here.checkpoint()["claims"] == {}

            again = await here.watcher.prepare(DRIVER, [ref])  # the device is free again
            assert again.claims[uid].error == ""

    asyncio.run(body())


def test_a_driver_started_after_a_reboot_drops_the_earlier_boots_claims() -> None:
    async def body() -> None:
        async with node(Node) as here:
            boot = here.root / "boot_id"
            boot.write_text("11111111-1111-4111-8111-111111111111\n")
            await here.start(DP_BOOT_ID_FILE=str(boot))
            uid = here.server.add_claim(claim("old", [("gpu", DEVICE)]))["metadata"]["uid"]
            ref = ("default", "old", uid)
            assert (await here.watcher.prepare(DRIVER, [ref])).claims[uid].error == ""
            assert here.process is not None
            here.process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(here.process.wait(), TIMEOUT) == 0

            boot.write_text("22222222-2222-4222-8222-222222222222\n")
            await here.start(DP_BOOT_ID_FILE=str(boot))
            saved = here.checkpoint()
            assert saved == {"bootID": "22222222-2222-4222-8222-222222222222", "claims": {}}
            assert here.files() == []
            assert (await here.watcher.prepare(DRIVER, [ref])).claims[uid].error == ""
            assert list(here.checkpoint()["claims"]) == [uid]
            here.process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(here.process.wait(), TIMEOUT)
            assert here.process.stderr is not None
            log = (await here.process.stderr.read()).decode()
            assert "dra.checkpoint.earlier_boot" in log
            assert "saved_boot_id=11111111-1111-4111-8111-111111111111" in log

    asyncio.run(body())


def test_an_unknown_failpoint_stops_the_driver_at_start_naming_it() -> None:
    async def body() -> None:
        async with node(Node) as here:
            here.process = await start_serve(
                here.root, here.server.url, here.kubelet, DP_FAILPOINT="prepare-maybe"
            )
            code = await asyncio.wait_for(here.process.wait(), TIMEOUT)
            assert here.process.stderr is not None
            log = (await here.process.stderr.read()).decode()
            assert code == 2, log
            assert "DP_FAILPOINT" in log and "prepare-maybe" in log

    asyncio.run(body())
