"""Registration bookkeeping against a kubelet directory whose kubelet never answers."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.kubelet import registrar as registrar_module
from deviceplugin.kubelet.registrar import Registrar
from deviceplugin.kubelet.responder import NodeAllocator
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.kubelet.v1beta1 import api_pb2_grpc
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


class _SilentKubelet(api_pb2_grpc.RegistrationServicer):
    """A kubelet that takes every Register and never answers it."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def Register(self, request: Any, context: Any) -> Any:
        self.asked.set()
        await asyncio.Event().wait()


async def _plugin_server(root: Path) -> PluginServer:
    device = Device(
        id="GPU-a",
        physical_uuid="GPU-a",
        gpu_uuid="GPU-a",
        gpu_index=0,
        gpu_minor=0,
        numa_node=None,
    )
    server = PluginServer(ResourceSet("example.com/gpu", (device,)), root, NodeAllocator(Config()))
    await server.start()
    return server


def test_a_register_under_way_is_not_waited_for() -> None:
    """`underway` returns once the Register has left, long before a silent kubelet answers it;
    the registration itself keeps waiting."""

    async def body() -> None:
        root = Path(tempfile.mkdtemp(prefix="dpr"))
        kubelet = _SilentKubelet()
        listening = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, listening)
        listening.add_insecure_port(f"unix://{root / 'kubelet.sock'}")
        await listening.start()
        server = await _plugin_server(root)
        registrar = Registrar(root, Metrics())
        try:
            registrar.register(server)
            await asyncio.wait_for(registrar.underway(), 2)
            await asyncio.wait_for(kubelet.asked.wait(), 2)  # it did leave
            assert not registrar.registered
        finally:
            registrar.forget_all()
            await server.stop(0)
            await listening.stop(0)
            shutil.rmtree(root, ignore_errors=True)

    asyncio.run(body())


def test_no_register_to_wait_for_without_a_kubelet_or_once_forgotten() -> None:
    """A first attempt that fails (no kubelet.sock) and a registration forgotten before it began
    both end the wait; retrying goes on in the background."""

    async def body() -> None:
        root = Path(tempfile.mkdtemp(prefix="dpr"))
        server = await _plugin_server(root)
        registrar = Registrar(root, Metrics())
        try:
            registrar.register(server)
            await asyncio.wait_for(registrar.underway(), 2)
            assert not registrar.registered and registrar.restarting
            registrar.forget(server.name)
            registrar.register(server)
            registrar.forget(server.name)  # before its task ran at all
            await asyncio.wait_for(registrar.underway(), 2)
        finally:
            registrar.forget_all()
            await server.stop(0)
            shutil.rmtree(root, ignore_errors=True)

    asyncio.run(body())


def test_a_registration_that_breaks_off_holds_up_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error in the registration task ends the wait too: start-up goes on."""

    async def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(registrar_module, "register_until_done", broken)

    async def body() -> None:
        root = Path(tempfile.mkdtemp(prefix="dpr"))
        server = await _plugin_server(root)
        registrar = Registrar(root, Metrics())
        try:
            registrar.register(server)
            await asyncio.wait_for(registrar.underway(), 2)
            assert not registrar.registered
        finally:
            registrar.forget_all()
            await server.stop(0)
            shutil.rmtree(root, ignore_errors=True)

    asyncio.run(body())
