"""A kubelet plugin-watcher emulator for DRA drivers: registration and DRA calls over the real
unix sockets, as the kubelet's plugin manager and DRA manager make them.

It polls `<root>/plugins_registry/` for sockets (names starting with `.` are skipped, like the
kubelet's watcher does), and for each new one: GetInfo (1 s timeout); a type other than
`DRAPlugin` is refused; the plugin's `supported_versions` must name a DRA service this kubelet
speaks, and the first one that does is chosen (the kubelet takes the plugin's order); the same
endpoint registered twice for a driver is refused; a channel to the endpoint is opened (the
kubelet does not wait for it to connect: `connected` says whether it did within
`connect_timeout`); then NotifyRegistrationStatus (5 s timeout) reports the outcome, with the
kubelet's error texts.
A failed registration is retried every second, as the plugin manager's reconciler does. A
socket that disappears deregisters the plugin; one re-created (a restarted driver, also one
killed and started again, whose socket is replaced) registers again. `prepare` / `unprepare`
call the chosen service, or a given version, as the kubelet does when a pod using claims starts
or ends.

Health, as the kubelet's DRA manager follows it with its ResourceHealthStatus gate on
(`health_gate`): the first health service of the plugin's `supported_versions` this kubelet knows
is chosen, and a NodeWatchResources stream is kept open (reopened every `health_retry` seconds
after it ends; an Unimplemented answer stops it). Each report replaces the health of the
devices it names; a device not heard of within its timeout reads Unknown, and the plugin's
devices are forgotten when the stream ends. `resource_health` is what the kubelet puts in a
container's `allocatedResourcesStatus` for a claim it prepared.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from deviceplugin.model.record import record
from deviceplugin.wire.dra.v1 import api_pb2 as v1
from deviceplugin.wire.dra.v1 import api_pb2_grpc as v1_grpc
from deviceplugin.wire.dra.v1beta1 import api_pb2 as v1beta1
from deviceplugin.wire.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from deviceplugin.wire.drahealth.v1 import api_pb2 as health_v1
from deviceplugin.wire.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from deviceplugin.wire.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from deviceplugin.wire.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from deviceplugin.wire.pluginregistration.v1 import api_pb2 as registration
from deviceplugin.wire.pluginregistration.v1 import api_pb2_grpc as registration_grpc

REGISTRY_DIR = "plugins_registry"
DRA_TYPE = "DRAPlugin"
# The kubelet's servicesSupportedByKubelet (1.34+), newest first; a 1.32 kubelet knows v1beta1 only.
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
_STUBS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (v1, v1_grpc),
    "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc),
}
# The kubelet's healthServicesSupportedByKubelet (1.37+); 1.31 to 1.36 know v1alpha1 only.
KUBELET_HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
_HEALTH_STUBS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAResourceHealth": (health_v1, health_v1_grpc),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1, health_v1alpha1_grpc),
}
DEFAULT_HEALTH_TIMEOUT = 30.0  # the kubelet's, for a device reported without one
HEALTH_RETRY_SECONDS = 5.0  # the kubelet reopens an ended health stream this often
GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0
CALL_TIMEOUT = 45.0  # the kubelet's default DRA call timeout
RETRY_SECONDS = 1.0  # the plugin manager's reconciler retries a failed registration
ClaimTriple = tuple[str, str, str]  # namespace, name, uid


@record(frozen=True)
class SeenHealth:
    """A device's health as the kubelet last heard it."""

    health: str  # HEALTHY, UNHEALTHY or UNKNOWN
    message: str
    timeout: float  # seconds after `at` that it turns Unknown
    at: float  # loop time of the report


@record
class Plugin:
    """A registered DRA plugin."""

    name: str
    endpoint: str
    service: str  # the service chosen from its supported versions
    socket: Path  # its registration socket
    channel: grpc.aio.Channel
    connected: bool = False
    health_service: str = ""  # the health service chosen, "" when it offers none we know
    health: dict[tuple[str, str], SeenHealth] = field(default_factory=dict)  # (pool, device)
    health_reports: int = 0
    health_task: asyncio.Task[None] | None = None


@record(frozen=True)
class Attempt:
    """One registration attempt as the kubelet made it."""

    socket: str
    name: str
    ok: bool
    error: str
    versions: tuple[str, ...] = ()


@record
class _Seen:
    identity: tuple[int, int]  # inode and change time: a socket made anew differs in either
    name: str = ""  # registered under this driver name; "" after a failed attempt
    retry_at: float = 0.0


@record
class PluginWatcher:
    """Start with `await start()`; `plugins` maps driver name to its registered plugin."""

    root: Path
    poll: float = 0.05
    services: tuple[str, ...] = KUBELET_SERVICES
    connect_timeout: float = 1.0  # how long `connected` waits for the endpoint
    health_services: tuple[str, ...] = KUBELET_HEALTH_SERVICES
    health_gate: bool = True  # the kubelet's ResourceHealthStatus feature gate
    health_retry: float = HEALTH_RETRY_SECONDS
    plugins: dict[str, Plugin] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    prepared: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # (driver, uid)
    _seen: dict[Path, _Seen] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def registry(self) -> Path:
        return self.root / REGISTRY_DIR

    async def start(self) -> None:
        self.registry.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for plugin in list(self.plugins.values()):
            await _close(plugin)
        self.plugins.clear()

    @property
    def watching(self) -> bool:
        return self._task is not None

    async def wait_registered(
        self, driver: str, timeout: float = 5.0, replacing: Plugin | None = None
    ) -> Plugin:
        """The plugin once `driver` is registered by another instance than `replacing` (the one
        a restart stopped: until a poll sees its socket go, it stays registered, and a call on
        its channel is cancelled when that poll closes it); TimeoutError otherwise."""

        def registered() -> bool:
            plugin = self.plugins.get(driver)
            return plugin is not None and plugin is not replacing

        await self._wait(registered, timeout)
        return self.plugins[driver]

    async def wait_deregistered(self, driver: str, timeout: float = 5.0) -> None:
        await self._wait(lambda: driver not in self.plugins, timeout)

    async def prepare(
        self, driver: str, claims: Sequence[ClaimTriple], version: str | None = None
    ) -> Any:
        """NodePrepareResources for `claims`: the chosen service's response message."""
        messages, stub = self._stub(driver, version)
        request = messages.NodePrepareResourcesRequest(claims=_claims(messages, claims))
        response = await stub.NodePrepareResources(request, timeout=CALL_TIMEOUT)
        for uid, entry in response.claims.items():
            if not entry.error:
                self.prepared[(driver, uid)] = list(entry.devices)
        return response

    async def unprepare(
        self, driver: str, claims: Sequence[ClaimTriple], version: str | None = None
    ) -> Any:
        messages, stub = self._stub(driver, version)
        request = messages.NodeUnprepareResourcesRequest(claims=_claims(messages, claims))
        response = await stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT)
        for uid, entry in response.claims.items():
            if not entry.error:
                self.prepared.pop((driver, uid), None)
        return response

    def resource_health(self, driver: str, uid: str) -> list[dict[str, str]]:
        """A prepared claim's devices as the kubelet lists them in `allocatedResourcesStatus`:
        `resourceID` (the first CDI ID), `health` (Healthy, Unhealthy or Unknown) and the
        `message` of an unhealthy device; empty with the gate off, as the kubelet then adds
        nothing to the pod status."""
        if not self.health_gate:
            return []
        plugin = self.plugins.get(driver)
        now = asyncio.get_running_loop().time()
        entries = []
        for device in self.prepared.get((driver, uid), []):
            seen = plugin.health.get((device.pool_name, device.device_name)) if plugin else None
            if seen is None or now - seen.at > seen.timeout:
                seen = SeenHealth("UNKNOWN", "", 0.0, now)
            resource_id = (
                device.cdi_device_ids[0]
                if device.cdi_device_ids
                else f"{driver}/{device.pool_name}/{device.device_name}"
            )
            entry = {"resourceID": resource_id, "health": seen.health.capitalize()}
            if seen.message:
                entry["message"] = seen.message
            entries.append(entry)
        return entries

    # --- watching -------------------------------------------------------------------------------

    async def _wait(self, done: Any, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                self._changed.clear()
                await self._changed.wait()

    async def _watch(self) -> None:
        while True:
            await self._scan()
            await asyncio.sleep(self.poll)

    async def _scan(self) -> None:
        present = dict(_sockets(self.registry))
        for path, seen in list(self._seen.items()):
            if present.get(path) != seen.identity:
                del self._seen[path]
                await self._deregister(seen.name, path)
        now = asyncio.get_running_loop().time()
        for path, identity in present.items():
            seen = self._seen.setdefault(path, _Seen(identity))
            if not seen.name and now >= seen.retry_at:
                seen.name = await self._register(path)
                seen.retry_at = now + RETRY_SECONDS
        self._changed.set()

    async def _register(self, socket: Path) -> str:
        """One registration, reported back to the plugin; the driver name registered or ""."""
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = registration_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(registration.InfoRequest(), timeout=GET_INFO_TIMEOUT)
            except grpc.aio.AioRpcError as err:
                self.attempts.append(Attempt(str(socket), "", False, f"GetInfo: {err.details()}"))
                return ""
            versions = tuple(info.supported_versions)
            error = self._refusal(info, socket)
            plugin = None
            if not error:
                plugin = Plugin(
                    info.name,
                    info.endpoint or str(socket),
                    next(s for s in versions if s in self.services),
                    socket,
                    grpc.aio.insecure_channel(f"unix://{info.endpoint or socket}"),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(plugin.channel.channel_ready(), self.connect_timeout)
                    plugin.connected = True
                known = [s for s in self.health_services if s in versions]
                plugin.health_service = known[0] if known else ""
                if self.health_gate and plugin.health_service:
                    plugin.health_task = asyncio.get_running_loop().create_task(
                        self._watch_health(plugin)
                    )
                self.plugins[info.name] = plugin
            self.attempts.append(Attempt(str(socket), info.name, not error, error, versions))
            status = registration.RegistrationStatus(plugin_registered=not error, error=error)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(status, timeout=NOTIFY_TIMEOUT)
            return info.name if plugin is not None else ""

    def _refusal(self, info: registration.PluginInfo, socket: Path) -> str:
        """The kubelet's reason to refuse this plugin, or ""."""
        if info.type != DRA_TYPE:
            return f"no handler registered for plugin type: {info.type} at socket {socket}"
        endpoint = info.endpoint or str(socket)
        prefix = f"invalid supported gRPC versions of DRA driver plugin {info.name} at endpoint"
        versions = list(info.supported_versions)
        if not versions:
            empty = "empty list of supported gRPC services (aka supported versions)"
            return f"{prefix} {endpoint}: {empty}"
        if not any(v in self.services for v in versions):
            return (
                f"{prefix} {endpoint}: none of services supported by the plugin ({versions}) "
                f"are supported by the kubelet ({list(self.services)})"
            )
        known = self.plugins.get(info.name)
        if known is not None and known.endpoint == endpoint:
            return f"endpoint {endpoint} already registered for DRA driver plugin {info.name}"
        return ""

    async def _deregister(self, name: str, socket: Path) -> None:
        plugin = self.plugins.get(name)
        if plugin is not None and plugin.socket == socket:
            del self.plugins[name]
            await _close(plugin)

    async def _watch_health(self, plugin: Plugin) -> None:
        """Follow the plugin's health stream until it answers Unimplemented or is closed."""
        messages, grpc_module = _HEALTH_STUBS[plugin.health_service]
        stub = grpc_module.DRAResourceHealthStub(plugin.channel)
        while True:
            try:
                async for report in stub.NodeWatchResources(messages.NodeWatchResourcesRequest()):
                    self._seen_health(plugin, messages, report)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return
            plugin.health.clear()  # the kubelet forgets a driver's health when its stream ends
            self._changed.set()
            await asyncio.sleep(self.health_retry)

    def _seen_health(self, plugin: Plugin, messages: ModuleType, report: Any) -> None:
        """The kubelet's cache update: reported devices replace their entry; others turn Unknown
        once their timeout has passed."""
        now = asyncio.get_running_loop().time()
        reported = set()
        for device in report.devices:
            key = (device.device.pool_name, device.device.device_name)
            reported.add(key)
            timeout = float(device.health_check_timeout_seconds)
            plugin.health[key] = SeenHealth(
                messages.HealthStatus.Name(device.health),
                device.message,
                timeout if timeout > 0 else DEFAULT_HEALTH_TIMEOUT,
                now,
            )
        for key, seen in list(plugin.health.items()):
            if key not in reported and now - seen.at > seen.timeout:
                del plugin.health[key]
        plugin.health_reports += 1
        self._changed.set()

    def _stub(self, driver: str, version: str | None) -> tuple[ModuleType, Any]:
        plugin = self.plugins.get(driver)
        if plugin is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        messages, grpc_module = _STUBS[version or plugin.service]
        return messages, grpc_module.DRAPluginStub(plugin.channel)


async def _close(plugin: Plugin) -> None:
    if plugin.health_task is not None:
        plugin.health_task.cancel()
        # Wait for it to end without taking on its cancellation: suppressing CancelledError
        # here would also swallow the cancellation of the task closing it (`stop` cancelling
        # a scan that is deregistering), which then never ends.
        await asyncio.wait([plugin.health_task])
    await plugin.channel.close(None)


def _claims(messages: ModuleType, claims: Sequence[ClaimTriple]) -> list[Any]:
    return [messages.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]


def _sockets(directory: Path) -> Iterable[tuple[Path, tuple[int, int]]]:
    """Each socket with its identity. The inode alone is not one: a socket removed and made
    again between two polls may get the same inode back, which the kubelet's watcher (told of
    every creation) does not miss either."""
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISSOCK(info.st_mode):
                    yield Path(entry.path), (info.st_ino, info.st_ctime_ns)
