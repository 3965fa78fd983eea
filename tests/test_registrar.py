"""Registration bookkeeping against a kubelet directory whose kubelet never answers."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from deviceplugin.kubelet.registrar import Registrar
from deviceplugin.kubelet.responder import NodeAllocator
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.model.config import Config
from deviceplugin.model.devices import Device
from deviceplugin.model.resources import ResourceSet
from deviceplugin.ops.metrics import Metrics


def test_forgetting_a_pending_reregistration_ends_the_restart() -> None:
    async def body() -> None:
        root = Path(tempfile.mkdtemp(prefix="dpr"))
        (root / "kubelet.sock").touch()  # present, but nobody answers on it
        device = Device(
            id="GPU-a",
            physical_uuid="GPU-a",
            gpu_uuid="GPU-a",
            gpu_index=0,
            gpu_minor=0,
            numa_node=None,
        )
        server = PluginServer(
            ResourceSet("example.com/gpu", (device,)), root, NodeAllocator(Config())
        )
        await server.start()
        registrar = Registrar(root, Metrics())
        try:
            await registrar.reregister({server.name: server}, "test")
            assert registrar.restarting and not registrar.registered
            registrar.forget(server.name)  # the resource went away while still registering
            assert not registrar.restarting
        finally:
            registrar.forget_all()
            await server.stop(0)
            shutil.rmtree(root, ignore_errors=True)

    asyncio.run(body())
