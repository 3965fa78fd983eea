"""Registration bookkeeping against a kubelet directory whose kubelet never answers."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.kubelet import registrar as registrar_module
from deviceplugin.kubelet.registrar import Registrar
from deviceplugin.kubelet.responder import NodeAllocator
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.model.config import Config
from deviceplugin.model.devices import Device
from deviceplugin.model.resources import ResourceSet
from deviceplugin.ops.metrics import Metrics
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2_grpc


@contextlib.asynccontextmanager
async def _registering(
    kubelet: Callable[[Path], None] = lambda root: None,
) -> AsyncIterator[tuple[Path, PluginServer, Registrar]]:
    """A serving plugin server and a registrar on a fresh kubelet directory, which `kubelet`
    prepares first; everything stopped and removed again however the test ends."""
    root = Path(tempfile.mkdtemp(prefix="dpr"))
    device = Device(
        id="GPU-a",
        physical_uuid="GPU-a",
        gpu_uuid="GPU-a",
        gpu_index=0,
        gpu_minor=0,
        numa_node=None,
    )
    server = PluginServer(ResourceSet("example.com/gpu", (device,)), root, NodeAllocator(Config()))
    try:
        kubelet(root)
        await server.start()
        registrar = Registrar(root, Metrics())
        try:
            yield root, server, registrar
        finally:
            registrar.forget_all()
            await server.stop(0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_forgetting_a_pending_reregistration_ends_the_restart() -> None:
    def silent_socket(root: Path) -> None:
        (root / "kubelet.sock").touch()  # present, but nobody answers on it

    async def body() -> None:
        async with _registering(silent_socket) as (_, server, registrar):
            await registrar.reregister({server.name: server}, "test")
            assert registrar.restarting and not registrar.registered
            registrar.forget(server.name)  # the resource went away while still registering
            assert not registrar.restarting

    asyncio.run(body())


class _SilentKubelet(api_pb2_grpc.RegistrationServicer):
    """A kubelet that takes every Register and never answers it."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def Register(self, request: Any, context: Any) -> Any:
        self.asked.set()
        await asyncio.Event().wait()


def test_a_register_under_way_is_not_waited_for() -> None:
    """`underway` returns once the Register has left, long before a silent kubelet answers it;
    the registration itself keeps waiting."""

    async def body() -> None:
        async with _registering() as (root, server, registrar):
            kubelet = _SilentKubelet()
            listening = grpc.aio.server()
            api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, listening)
            listening.add_insecure_port(f"unix://{root / 'kubelet.sock'}")
            await listening.start()
            try:
                registrar.register(server)
                await asyncio.wait_for(registrar.underway(), 2)
                await asyncio.wait_for(kubelet.asked.wait(), 2)  # it did leave
                assert not registrar.registered
            finally:
                registrar.forget_all()
                await listening.stop(0)

    asyncio.run(body())


def test_no_register_to_wait_for_without_a_kubelet_or_once_forgotten() -> None:
    """A first attempt that fails (no kubelet.sock) and a registration forgotten before it began
    both end the wait; retrying goes on in the background."""

    async def body() -> None:
        async with _registering() as (_, server, registrar):
            registrar.register(server)
            await asyncio.wait_for(registrar.underway(), 2)
            assert not registrar.registered and registrar.restarting
            registrar.forget(server.name)
            registrar.register(server)
            registrar.forget(server.name)  # before its task ran at all
            await asyncio.wait_for(registrar.underway(), 2)

    asyncio.run(body())


def test_a_registration_that_breaks_off_holds_up_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error in the registration task ends the wait too: start-up goes on."""

    async def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(registrar_module, "register_until_done", broken)

    async def body() -> None:
        async with _registering() as (_, server, registrar):
            registrar.register(server)
            await asyncio.wait_for(registrar.underway(), 2)
            assert not registrar.registered

    asyncio.run(body())
