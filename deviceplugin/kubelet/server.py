"""One grpc.aio DevicePlugin server per resource, on `<kubelet-dir>/<socket name>`.

A PluginServer owns its socket and its current ResourceSet. `update()` swaps the set and wakes
every open ListAndWatch stream, which then sends the full list once; the message is built once
per change, not per stream. Allocate and GetPreferredAllocation delegate to an `Allocator`
(pure code in allocation.py / topology.py). This is the one place that turns domain errors into
gRPC status codes: AllocationError -> INVALID_ARGUMENT with the message, anything unexpected ->
INTERNAL and a log line; the server keeps serving either way. `owns_socket` says whether the
socket path is still the socket it bound (the registrar serves again when it is not).

A registered plugin always has one ListAndWatch stream open from the kubelet. `unwatched_for`
says how long none has been (after one was): kubelets before 1.37 keep one endpoint per resource
and, when a rolling update's old instance ends, disconnect the newer one registered beside it,
leaving every device of the resource unhealthy to the kubelet until the plugin registers again.
`on_unwatched` is told the moment the last stream ends. (Where an instance beside it still
serves, the kubelet follows that one: registering again would only take it back.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc

from deviceplugin.model.errors import AllocationError, ConfigError
from deviceplugin.model.log import log_event, log_exception
from deviceplugin.model.resources import ResourceSet
from deviceplugin.node.unixgrpc import SocketPathError, UnixServer, others_listening
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

logger = logging.getLogger(__name__)

OPTIONS = api_pb2.DevicePluginOptions(
    pre_start_required=False, get_preferred_allocation_available=True
)


class Allocator(Protocol):
    """What the server needs from the allocation code, for the resource it serves."""

    def prepare(self, resource: ResourceSet) -> None: ...

    def allocate(
        self, resource: ResourceSet, container_requests: Sequence[Sequence[str]]
    ) -> api_pb2.AllocateResponse: ...

    def preferred(
        self,
        resource: ResourceSet,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> list[str]: ...


class Observer(Protocol):
    """Receives per-call outcomes (for metrics); every method must be cheap and never raise."""

    def rpc_done(self, resource: str, method: str, seconds: float, ok: bool) -> None: ...


class _NullObserver:
    def rpc_done(self, resource: str, method: str, seconds: float, ok: bool) -> None:
        return None


def list_response(resource: ResourceSet) -> api_pb2.ListAndWatchResponse:
    """The ListAndWatch message for a resource set, with NUMA topology where known."""
    devices = []
    for device in resource.devices:
        topology = None
        if device.numa_node is not None:
            topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.numa_node)])
        devices.append(api_pb2.Device(ID=device.id, health=device.health.value, topology=topology))
    return api_pb2.ListAndWatchResponse(devices=devices)


class PluginServer(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service for one resource name, bound to one unix socket."""

    def __init__(
        self,
        resource: ResourceSet,
        kubelet_dir: Path,
        allocator: Allocator,
        observer: Observer | None = None,
        on_unwatched: Callable[[str], None] | None = None,
    ) -> None:
        self._resource = resource
        self._message = list_response(resource)
        self._unix = UnixServer(kubelet_dir / resource.socket_name, beside_others=True)
        self._allocator = allocator
        self._observer: Observer = observer or _NullObserver()
        self._generation = 0
        self._changed = asyncio.Condition()
        self._closing = False
        self._on_unwatched = on_unwatched
        self._watching = 0  # ListAndWatch streams open
        self._unwatched_since: float | None = None  # None: a stream is open, or none ever was

    @property
    def name(self) -> str:
        return self._resource.name

    @property
    def resource(self) -> ResourceSet:
        return self._resource

    @property
    def socket_path(self) -> Path:
        return self._unix.socket

    @property
    def serving(self) -> bool:
        return self._unix.serving

    @property
    def owns_socket(self) -> bool:
        """The socket path is still the socket this server bound (not deleted, not replaced)."""
        return self._unix.owns_socket

    def unwatched_for(self) -> float:
        """Seconds since the kubelet's last ListAndWatch stream ended, while none is open; 0
        while one is, or before the first."""
        if self._watching or self._unwatched_since is None:
            return 0.0
        return time.monotonic() - self._unwatched_since

    def alone(self) -> bool:
        """No other instance of this server (a rolling update's other pod) is serving."""
        return not others_listening(self._unix.preferred, self.socket_path)

    def registered_again(self) -> None:
        """The kubelet's new stream is awaited from now: `unwatched_for` counts from here."""
        if self._unwatched_since is not None:
            self._unwatched_since = time.monotonic()

    async def start(self) -> None:
        """Replace whatever is at the socket path, listen, and serve; returns once the socket
        accepts calls. A path too long for a unix socket is a ConfigError of --kubelet-dir."""
        self._closing = False
        self._allocator.prepare(self._resource)
        try:
            await self._unix.start(
                lambda server: api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
            )
        except SocketPathError as err:
            raise ConfigError("--kubelet-dir", str(err)) from None

    async def stop(self, grace: float = 0.5) -> None:
        """End open streams, stop serving, and remove our socket (if it still is ours)."""
        self._closing = True
        async with self._changed:
            self._changed.notify_all()
        await self._unix.stop(grace)

    async def update(self, resource: ResourceSet) -> bool:
        """Serve a new device list; open ListAndWatch streams send it. False when unchanged."""
        if resource == self._resource:
            return False
        self._resource = resource
        self._message = list_response(resource)
        self._allocator.prepare(resource)
        self._generation += 1
        async with self._changed:
            self._changed.notify_all()
        return True

    # --- the DevicePlugin service -------------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        self._watching += 1
        self._unwatched_since = None
        try:
            while not self._closing:
                if sent != self._generation:
                    sent = self._generation
                    yield self._message
                    continue
                async with self._changed:
                    await self._changed.wait_for(self._news_since(sent))
        finally:
            self._watching -= 1
            if not self._watching:
                self._unwatched_since = time.monotonic()
                if not self._closing and self._on_unwatched is not None:
                    self._on_unwatched(self.name)

    def _news_since(self, sent: int) -> Callable[[], bool]:
        """The wake-up condition of a stream that has sent generation `sent`."""
        return lambda: self._closing or sent != self._generation

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocateResponse:
        started = time.perf_counter()
        requests = [list(container.devices_ids) for container in request.container_requests]
        ok = False
        try:
            response = self._allocator.allocate(self._resource, requests)
            ok = True
            return response
        except AllocationError as exc:
            log_event(
                logger, "allocate.refused", logging.WARNING, resource=self.name, error=str(exc)
            )
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:
            log_exception(logger, "allocate.failed", resource=self.name)
            await context.abort(grpc.StatusCode.INTERNAL, f"allocate failed: {exc}")
        finally:
            self._observer.rpc_done(self.name, "Allocate", time.perf_counter() - started, ok)

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.PreferredAllocationResponse:
        started = time.perf_counter()
        responses = []
        ok = True
        for container in request.container_requests:
            try:
                chosen = self._allocator.preferred(
                    self._resource,
                    list(container.available_deviceIDs),
                    list(container.must_include_deviceIDs),
                    container.allocation_size,
                )
            except Exception:
                # The preference is advisory: an empty answer lets the kubelet choose, while an
                # error here would fail the pod's admission.
                ok = False
                chosen = []
                log_exception(logger, "preferred.failed", resource=self.name)
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        elapsed = time.perf_counter() - started
        self._observer.rpc_done(self.name, "GetPreferredAllocation", elapsed, ok)
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
