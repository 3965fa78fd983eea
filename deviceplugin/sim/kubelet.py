"""A kubelet emulator: the kubelet's device manager as a device plugin sees it.

Serves Registration on `<dir>/kubelet.sock` with the kubelet's validation and error texts,
dials the plugin back inside Register (as kubelets 1.25+ do), calls GetDevicePluginOptions
once, then follows ListAndWatch and keeps what it reports. A registration for a name already
registered replaces the endpoint. When a stream ends, that resource's devices turn Unhealthy.
`restart()` behaves like a kubelet restart: stop, delete every socket in the directory, listen
again on a fresh kubelet.sock. Used by `deviceplugin demo`, the tests and the benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.model.kubenames import is_extended_resource_name
from deviceplugin.model.record import record
from deviceplugin.node.unixgrpc import close_unix, listen_unix
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

SUPPORTED_VERSIONS = ("v1beta1",)


@record
class SeenDevice:
    """A device as the kubelet last saw it in ListAndWatch."""

    id: str
    health: str
    numa_nodes: tuple[int, ...]

    @property
    def healthy(self) -> bool:
        return self.health == "Healthy"


@record
class Endpoint:
    """One registration: where the plugin serves, and what its stream reported."""

    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    registered_at: float
    devices: dict[str, SeenDevice] = field(default_factory=dict)
    updates: int = 0
    connected: bool = True
    channel: grpc.aio.Channel | None = None
    stream: asyncio.Task[None] | None = None


@record(frozen=True)
class Registration:
    """One Register call as the kubelet received it."""

    resource: str
    endpoint: str
    version: str
    ok: bool
    error: str
    at: float


class KubeletEmulator(api_pb2_grpc.RegistrationServicer):
    """Registration server plus device-manager bookkeeping, in the caller's event loop."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.endpoints: dict[str, Endpoint] = {}
        self.registrations: list[Registration] = []
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    async def start(self) -> None:
        """Clean the directory of sockets (as the kubelet does) and listen on kubelet.sock."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in self.directory.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()
        self._server = await listen_unix(
            self.socket,
            lambda server: api_pb2_grpc.add_RegistrationServicer_to_server(self, server),
        )

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection; kubelet.sock goes away."""
        server, self._server = self._server, None
        await close_unix(server, self.socket, 0)
        for endpoint in self.endpoints.values():
            await self._disconnect(endpoint)
        await self._notify()

    async def restart(self) -> None:
        """A kubelet restart: streams end, plugin sockets are deleted, kubelet.sock is new."""
        await self.stop()
        await self.start()

    # --- Registration service -----------------------------------------------------------------

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        error = self._validate(request)
        if not error:
            error = await self._connect(request)
        self.registrations.append(
            Registration(
                resource=request.resource_name,
                endpoint=request.endpoint,
                version=request.version,
                ok=not error,
                error=error,
                at=time.monotonic(),
            )
        )
        await self._notify()
        if error:
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        return api_pb2.Empty()

    def _validate(self, request: api_pb2.RegisterRequest) -> str:
        if request.version not in SUPPORTED_VERSIONS:
            return (
                f'requested API version "{request.version}" is not supported by kubelet. '
                f'Supported version is ["v1beta1"]'
            )
        if not is_extended_resource_name(request.resource_name):
            return f'the ResourceName "{request.resource_name}" is invalid'
        return ""

    async def _connect(self, request: api_pb2.RegisterRequest) -> str:
        channel = grpc.aio.insecure_channel(f"unix://{self.directory / request.endpoint}")
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=10)
        except TimeoutError:
            await channel.close(None)
            return "failed to dial device plugin: context deadline exceeded"
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            options = await stub.GetDevicePluginOptions(api_pb2.Empty())
        except grpc.aio.AioRpcError as exc:
            await channel.close(None)
            return f"failed to get device plugin options: {exc.details()}"
        previous = self.endpoints.get(request.resource_name)
        endpoint = Endpoint(
            resource=request.resource_name,
            endpoint=request.endpoint,
            options=options,
            registered_at=time.monotonic(),
            channel=channel,
        )
        if previous is not None:
            endpoint.devices = dict(previous.devices)
            await self._disconnect(previous)
        self.endpoints[request.resource_name] = endpoint
        endpoint.stream = asyncio.get_running_loop().create_task(self._follow(endpoint, stub))
        return ""

    async def _follow(self, endpoint: Endpoint, stub: api_pb2_grpc.DevicePluginStub) -> None:
        try:
            async for message in stub.ListAndWatch(api_pb2.Empty()):
                endpoint.devices = {
                    device.ID: SeenDevice(
                        id=device.ID,
                        health=device.health,
                        numa_nodes=tuple(node.ID for node in device.topology.nodes),
                    )
                    for device in message.devices
                }
                endpoint.updates += 1
                await self._notify()
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        if self.endpoints.get(endpoint.resource) is endpoint:
            endpoint.connected = False
            for device in endpoint.devices.values():
                device.health = "Unhealthy"
            await self._notify()

    async def drop(self, resource: str) -> None:
        """What a kubelet before 1.37 does to the resource's endpoint when another instance's
        ListAndWatch stream for it ends (a rolling update's old pod): disconnects it, and every
        device of the resource turns unhealthy, until the plugin registers again."""
        endpoint = self.endpoints[resource]
        await self._disconnect(endpoint)
        for device in endpoint.devices.values():
            device.health = "Unhealthy"
        await self._notify()

    async def _disconnect(self, endpoint: Endpoint) -> None:
        endpoint.connected = False
        if endpoint.stream is not None and not endpoint.stream.done():
            endpoint.stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await endpoint.stream
        if endpoint.channel is not None:
            await endpoint.channel.close(None)
            endpoint.channel = None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- what a test or the demo asks ---------------------------------------------------------

    def resources(self) -> list[str]:
        return sorted(name for name, ep in self.endpoints.items() if ep.connected)

    def allocatable(self, resource: str) -> int:
        endpoint = self.endpoints.get(resource)
        if endpoint is None:
            return 0
        return sum(device.healthy for device in endpoint.devices.values())

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        endpoint = self.endpoints.get(resource)
        return dict(endpoint.devices) if endpoint else {}

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait until `predicate()` holds after some kubelet-visible change; False on timeout."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(predicate), timeout)
            except TimeoutError:
                return predicate()
        return True

    def _stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        endpoint = self.endpoints.get(resource)
        if endpoint is None or endpoint.channel is None:
            raise KeyError(f"{resource} is not registered")
        return api_pb2_grpc.DevicePluginStub(endpoint.channel)

    async def allocate(
        self, resource: str, container_requests: Sequence[Sequence[str]]
    ) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=list(ids))
                for ids in container_requests
            ]
        )
        response: api_pb2.AllocateResponse = await self._stub(resource).Allocate(request)
        return response

    async def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = await self._stub(resource).GetPreferredAllocation(request)
        return list(response.container_responses[0].deviceIDs)
