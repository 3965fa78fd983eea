"""The kubelet's DRA resource-health service (KEP-4680), `v1.DRAResourceHealth` and
`v1alpha1.DRAResourceHealth` on the DRA socket: how the kubelet learns a prepared device's health
and shows it in the pod's `status.containerStatuses[].allocatedResourcesStatus`.

The kubelet opens one NodeWatchResources stream per registered plugin, only with its
`ResourceHealthStatus` feature gate (beta, on by default since 1.36), and keeps it open. Every
message is the complete list of the driver's devices (the pool is the node). A device the kubelet
has not heard of for `health_check_timeout_seconds` turns Unknown, so the list goes out at once,
on every change, and again every `resend_seconds` (a third of the timeout) while nothing
changes. Kubelets 1.37+ prefer v1, 1.31 to 1.36 speak only v1alpha1; the two carry the same
messages in another proto package, so one implementation, given each version's messages, serves
both (as `plugin.py` does for DRAPlugin).

A device is unhealthy while its UUID, or its GPU's for a MIG device, is marked unhealthy by the
health monitor; its reason (`xid-79`, `xid-95: RESET_GPU`) is the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from types import ModuleType
from typing import Any

import grpc

from deviceplugin.dra.kubeletcalls import KubeletCalls, service_name
from deviceplugin.model.devices import Gpu, MigDevice
from deviceplugin.model.record import record
from deviceplugin.model.slices import unhealthy_reason
from deviceplugin.wire.drahealth.v1 import api_pb2 as v1
from deviceplugin.wire.drahealth.v1 import api_pb2_grpc as v1_grpc
from deviceplugin.wire.drahealth.v1alpha1 import api_pb2 as v1alpha1
from deviceplugin.wire.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc

HEALTH_TIMEOUT_SECONDS = 90
RESEND_SECONDS = HEALTH_TIMEOUT_SECONDS / 3
MAX_MESSAGE = 1024  # the kubelet truncates longer messages


@record(frozen=True)
class DeviceState:
    """One published device's health, by its name in the pool."""

    device: str
    healthy: bool
    reason: str = ""


def device_states(
    devices: Mapping[str, tuple[Gpu, MigDevice | None]], unhealthy: Mapping[str, str]
) -> tuple[DeviceState, ...]:
    """The health of each device (by published name) given the monitor's UUID -> reason; a MIG
    device's own reason comes first, else its GPU's."""
    states = []
    for name, (gpu, mig) in sorted(devices.items()):
        reason = unhealthy_reason(gpu, mig, unhealthy)
        states.append(DeviceState(name, reason is None, reason or ""))
    return tuple(states)


class HealthReporter:
    """The driver's current device health, streamed to every kubelet that watches it.

    `update()` replaces the states and wakes the open streams; `add_to(server, calls)` serves both
    versions on a gRPC server; `close()` ends the streams of that server (before it stops)."""

    def __init__(
        self,
        pool: str,
        resend_seconds: float = RESEND_SECONDS,
        timeout_seconds: int = HEALTH_TIMEOUT_SECONDS,
    ) -> None:
        self.pool = pool
        self.resend_seconds = resend_seconds
        self.timeout_seconds = timeout_seconds
        self._states: tuple[DeviceState, ...] = ()
        self._generation = 0
        self._changed = asyncio.Condition()
        self._streams: list[_Streams] = []

    @property
    def states(self) -> tuple[DeviceState, ...]:
        return self._states

    async def update(self, states: tuple[DeviceState, ...]) -> bool:
        """Report `states` from now on; open streams send them at once. False when unchanged."""
        if states == self._states:
            return False
        self._states = states
        self._generation += 1
        await self._wake()
        return True

    def add_to(self, server: grpc.aio.Server, calls: KubeletCalls) -> None:
        """Serve v1 and v1alpha1 on `server` (before it starts); `calls` counts each stream."""
        streams = _Streams(self)
        self._streams.append(streams)
        v1_grpc.add_DRAResourceHealthServicer_to_server(_Service(v1, streams, calls), server)
        v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
            _Service(v1alpha1, streams, calls), server
        )

    async def close(self) -> None:
        """End every open stream, so a stopping server need not wait for them."""
        for streams in self._streams:
            streams.closed = True
        self._streams.clear()
        await self._wake()

    def message(self, messages: ModuleType) -> Any:
        """The NodeWatchResourcesResponse of `messages`' version for the current states."""
        now = int(time.time())
        return messages.NodeWatchResourcesResponse(
            devices=[
                messages.DeviceHealth(
                    device=messages.DeviceIdentifier(pool_name=self.pool, device_name=s.device),
                    health=messages.HEALTHY if s.healthy else messages.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=self.timeout_seconds,
                    message=s.reason[:MAX_MESSAGE],
                )
                for s in self._states
            ]
        )

    async def watch(self, streams: _Streams, messages: ModuleType) -> AsyncIterator[Any]:
        """The messages of one stream: the states now, then on each change or resend."""
        while not streams.closed:
            sent = self._generation
            yield self.message(messages)
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(self._news_since(streams, sent)),
                        self.resend_seconds,
                    )

    def _news_since(self, streams: _Streams, sent: int) -> Callable[[], bool]:
        """The wake-up condition of a stream that has sent generation `sent`."""
        return lambda: streams.closed or sent != self._generation

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()


@record
class _Streams:
    """The streams of one server: `closed` ends them."""

    reporter: HealthReporter
    closed: bool = False


class _Service:
    """NodeWatchResources over one version's messages."""

    def __init__(self, messages: ModuleType, streams: _Streams, calls: KubeletCalls) -> None:
        self._messages = messages
        self._streams = streams
        self._calls = calls
        self._name = service_name(messages, "DRAResourceHealth")

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        self._calls.called(self._name)
        async for message in self._streams.reporter.watch(self._streams, self._messages):
            yield message
