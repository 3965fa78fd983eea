"""The kubelet's DRA service, `v1` and `v1beta1` on one socket: `<kubelet-root>/plugins/<driver>/
dra.sock`.

Kubelets 1.32 and 1.33 speak only `v1beta1.DRAPlugin`, 1.34 and later prefer `v1.DRAPlugin`;
the two differ in the proto package and in v1's optional `share_id`, so one implementation,
given each version's messages, serves both. Per-claim failures travel in the claim's `error`
(the kubelet retries that claim); a gRPC error would make the kubelet drop the whole answer,
so only a bug in this driver produces one (INTERNAL, logged). The resource-health service
(`devicehealth.py`) is served on the same socket.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from deviceplugin.dra.checkpoint import PreparedDevice
from deviceplugin.dra.devicehealth import HealthReporter
from deviceplugin.dra.kubeletcalls import KubeletCalls, service_name
from deviceplugin.dra.prepare import ClaimRef, Preparer
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import log_exception
from deviceplugin.node.unixgrpc import SocketPathError, UnixServer
from deviceplugin.wire.dra.v1 import api_pb2 as v1
from deviceplugin.wire.dra.v1 import api_pb2_grpc as v1_grpc
from deviceplugin.wire.dra.v1beta1 import api_pb2 as v1beta1
from deviceplugin.wire.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

logger = logging.getLogger(__name__)


class ClaimsObserver(Protocol):
    """Told how each kubelet call went (for metrics): how long it took, how many of its claims
    succeeded and failed, and why each Prepare failed; cheap, never raises."""

    def claims_done(self, method: str, seconds: float, ok: int, failed: int) -> None: ...

    def prepare_failed(self, reason: str) -> None: ...


class _Service:
    """NodePrepareResources / NodeUnprepareResources over one version's messages."""

    def __init__(
        self,
        messages: ModuleType,
        preparer: Preparer,
        observer: ClaimsObserver | None,
        calls: KubeletCalls,
    ) -> None:
        self._messages = messages
        self._preparer = preparer
        self._observer = observer
        self._calls = calls
        self._name = service_name(messages, "DRAPlugin")

    async def NodePrepareResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        self._calls.called(self._name)
        began, refs = time.perf_counter(), _refs(request)
        try:
            outcomes = await self._preparer.prepare(refs)
        except Exception as err:
            self._done("NodePrepareResources", began, [str(err)] * len(refs))
            self._failed(["internal"] * len(refs))
            log_exception(logger, "dra.prepare.failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"prepare failed: {err}")
        self._done("NodePrepareResources", began, [o.error for o in outcomes.values()])
        self._failed([o.reason for o in outcomes.values() if o.error])
        response = self._messages.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            entry.devices.extend(self._device(d) for d in outcome.devices)
        return response

    async def NodeUnprepareResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        self._calls.called(self._name)
        began, refs = time.perf_counter(), _refs(request)
        try:
            errors = await self._preparer.unprepare(refs)
        except Exception as err:
            self._done("NodeUnprepareResources", began, [str(err)] * len(refs))
            log_exception(logger, "dra.unprepare.failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"unprepare failed: {err}")
        self._done("NodeUnprepareResources", began, list(errors.values()))
        response = self._messages.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response

    def _done(self, method: str, began: float, errors: Collection[str]) -> None:
        """Report one call: an error per claim, empty for a claim that succeeded."""
        if self._observer is not None:
            failed = sum(1 for error in errors if error)
            seconds = time.perf_counter() - began
            self._observer.claims_done(method, seconds, len(errors) - failed, failed)

    def _failed(self, reasons: Collection[str]) -> None:
        if self._observer is not None:
            for reason in reasons:
                self._observer.prepare_failed(reason)

    def _device(self, device: PreparedDevice) -> Any:
        """The kubelet's Device; in v1 with the share ID of a shared device (v1beta1 has no
        field for it)."""
        message = self._messages.Device(
            request_names=list(device.requests),
            pool_name=device.pool,
            device_name=device.device,
            cdi_device_ids=list(device.cdi_ids),
        )
        if device.share_id and "share_id" in message.DESCRIPTOR.fields_by_name:
            message.share_id = device.share_id
        return message


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]


class DraServer:
    """Both versions of the DRA service for one driver, and of the health service when given a
    reporter, on one unix socket; `calls` records which versions the kubelet uses."""

    def __init__(
        self,
        preparer: Preparer,
        socket: Path,
        health: HealthReporter | None = None,
        observer: ClaimsObserver | None = None,
    ) -> None:
        self._unix = UnixServer(socket, beside_others=True)
        self._preparer = preparer
        self._observer = observer
        self._health = health
        self.calls = KubeletCalls()

    @property
    def socket(self) -> Path:
        """The DRA socket bound (beside another instance's during an update)."""
        return self._unix.socket

    @property
    def owns_socket(self) -> bool:
        """The socket path is still the socket this server bound (not deleted, not replaced)."""
        return self._unix.owns_socket

    async def start(self) -> None:
        """Listen (whatever is at the path is replaced); returns once calls are accepted. A path
        too long for a unix socket is a ConfigError of --kubelet-root."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)

        def add(server: grpc.aio.Server) -> None:
            for messages, stubs in ((v1, v1_grpc), (v1beta1, v1beta1_grpc)):
                service = _Service(messages, self._preparer, self._observer, self.calls)
                stubs.add_DRAPluginServicer_to_server(service, server)
            if self._health is not None:
                self._health.add_to(server, self.calls)

        try:
            await self._unix.start(add)
        except SocketPathError as err:
            raise ConfigError("--kubelet-root", str(err)) from None

    async def stop(self, grace: float = 0.5) -> None:
        """End the health streams, stop serving and remove the socket (if it still is ours)."""
        if self._health is not None:
            await self._health.close()
        await self._unix.stop(grace)
