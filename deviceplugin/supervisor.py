"""The composition root: owns the running state and reconciles it with the desired state.

Desired state = resources.build_plan(inventory, config) with health applied. Every trigger —
start, config change, SIGHUP, health event, MIG re-cut, kubelet restart — recomputes it and
goes through one reconcile step: unchanged servers are left alone, changed ones push a new
list on their live stream, removed ones stop (socket removed), new ones start and register.
Only a kubelet restart re-registers everything. All state lives on one asyncio loop; worker
threads (NVML event wait, file watchers) hand work to it with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.allocation import AllocateOptions
from deviceplugin.cli import Settings
from deviceplugin.config import Config, ParsedConfig, load_config_text
from deviceplugin.devices import Inventory
from deviceplugin.discovery import discover
from deviceplugin.errors import ConfigError, DevicePluginError, DiscoveryError, NvmlError
from deviceplugin.health import HealthChange, HealthMonitor, HealthPolicy, parse_duration
from deviceplugin.kubelet import KUBELET_SOCKET, register_until_done
from deviceplugin.log import log_event
from deviceplugin.metrics import Metrics
from deviceplugin.nvml import Nvml, open_nvml
from deviceplugin.resources import ResourceSet, apply_health, build_plan
from deviceplugin.responder import NodeAllocator
from deviceplugin.server import PluginServer

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 1.0


@dataclass(frozen=True)
class Status:
    """What /readyz and inspect report about the running plugin."""

    resources: Mapping[str, ResourceSet]
    registered: frozenset[str]
    health_monitor_alive: bool
    nvml_available: bool
    kubelet_restarting: bool
    config_source: str | None
    last_config_error: str | None
    started: bool = True

    @property
    def ready(self) -> bool:
        if not self.started:
            return False
        everything = set(self.resources) <= self.registered
        monitored = self.health_monitor_alive or not self.nvml_available or not self.resources
        return everything and monitored and not self.kubelet_restarting


class Supervisor:
    """Runs the plugin: servers per resource, registration, health, reloads."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._parsed: ParsedConfig | None = None
        self._config_text: str | None = None
        self._rejected_text: str | None = None  # refused content, judged again only once changed
        self._nvml: Nvml | None = None
        self._inventory: Inventory | None = None
        self._planned: dict[str, ResourceSet] = {}
        self._unhealthy: dict[str, str] = {}
        self._servers: dict[str, PluginServer] = {}
        self._registering: dict[str, asyncio.Task[None]] = {}
        self._registered: set[str] = set()
        self._monitor: HealthMonitor | None = None
        self._allocator: NodeAllocator | None = None
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self._kubelet_restarting = False
        self._last_config_error: str | None = None
        self._kubelet_identity: tuple[int, int] | None = None
        self._started = False

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load config, discover, serve and register. Raises ConfigError / DiscoveryError /
        NvmlError for start-up failures that `__main__` turns into exit codes."""
        parsed, text = self._read_config()
        self._adopt_config(parsed, text)
        config = parsed.config
        self._kubelet_identity = self._kubelet_socket_identity()
        try:
            self._nvml = open_nvml(self.settings.simulate, self.settings.simulate_events)
            self._nvml.init()
        except NvmlError as exc:
            self._nvml = None
            if config.flags.fail_on_init_error:
                raise
            log_event(
                logger,
                "nvml.unavailable",
                logging.WARNING,
                error=str(exc),
                hint="failOnInitError is false: advertising nothing, watching config",
            )
            self._started = True
            return
        self._inventory = discover(self._nvml)
        self._allocator_or_fail().configure(config, self._inventory)
        self.metrics.set_driver_version(self._inventory.driver_version)
        plan = build_plan(self._inventory, config)
        self._planned = dict(plan.resources)
        for warning in plan.warnings:
            log_event(logger, "resources.skipped", logging.WARNING, detail=warning)
        async with self._lock:
            await self._reconcile()
        self._start_monitor()
        self._started = True

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def shutdown(self) -> None:
        """Stop health monitoring and every server (sockets removed), then NVML."""
        if self._monitor is not None:
            await asyncio.to_thread(self._monitor.stop)
        async with self._lock:
            for task in self._registering.values():
                task.cancel()
            self._registering.clear()
            await asyncio.gather(*(s.stop(STOP_GRACE_SECONDS) for s in self._servers.values()))
            self._servers.clear()
        if self._nvml is not None:
            with contextlib.suppress(DevicePluginError):
                self._nvml.shutdown()
        log_event(logger, "plugin.stopped")

    def status(self) -> Status:
        return Status(
            resources={name: server.resource for name, server in self._servers.items()},
            registered=frozenset(self._registered),
            health_monitor_alive=self._monitor is not None and self._monitor.alive,
            nvml_available=self._nvml is not None,
            kubelet_restarting=self._kubelet_restarting,
            config_source=self.settings.config_file,
            last_config_error=self._last_config_error,
            started=self._started,
        )

    @property
    def config(self) -> Config:
        return self._parsed.config if self._parsed else Config()

    # --- triggers ---------------------------------------------------------------------------------

    async def reload(self, trigger: str, force: bool = False) -> bool:
        """Re-read the config and rediscover; apply only a valid result. True when applied."""
        async with self._lock:
            try:
                text = self._read_text()
            except ConfigError as exc:
                text = f"unreadable: {exc}"  # judged once, like any other refused content
                if force or text != self._rejected_text:
                    self._reject(trigger, exc, text)
                return False
            if not force and text in (self._config_text, self._rejected_text):
                self.metrics.config_reloads.labels("unchanged").inc()
                return False
            try:
                parsed = self._parse(text)
                AllocateOptions.from_config(parsed.config)  # refuse unusable options up front
                inventory = self._discover()
                plan = build_plan(inventory, parsed.config) if inventory else None
            except (ConfigError, DiscoveryError, NvmlError) as exc:
                self._reject(trigger, exc, text)
                return False
            if inventory is not None and plan is not None:
                self._inventory = inventory
                self._planned = dict(plan.resources)
            self._adopt_config(parsed, text)
            if inventory is not None and self._monitor is not None:
                self._monitor.update_inventory(inventory)
            self.metrics.config_reloads.labels("applied").inc()
            await self._reconcile()
            return True

    async def rediscover(self) -> bool:
        """Re-read the inventory (a MIG re-cut, a GPU gone); reconcile if it changed."""
        async with self._lock:
            try:
                inventory = self._discover()
                if inventory is None or inventory == self._inventory:
                    return False
                plan = build_plan(inventory, self.config)
            except (ConfigError, DiscoveryError, NvmlError) as exc:
                log_event(logger, "inventory.rejected", logging.WARNING, error=str(exc))
                return False
            log_event(logger, "inventory.changed", gpus=len(inventory.gpus))
            self._inventory = inventory
            self._planned = dict(plan.resources)
            self._allocator_or_fail().configure(self.config, inventory)
            if self._monitor is not None:
                self._monitor.update_inventory(inventory)
            await self._reconcile()
            return True

    async def kubelet_restarted(self, trigger: str) -> None:
        """Re-serve every server whose socket is gone and register everything again."""
        async with self._lock:
            self._kubelet_restarting = True
            self.metrics.kubelet_restarts.inc()
            log_event(logger, "kubelet.restarted", trigger=trigger)
            for task in self._registering.values():
                task.cancel()
            self._registering.clear()
            self._registered.clear()
            for server in self._servers.values():
                if not server.socket_path.exists():
                    await server.stop(0)
                    await server.start()
                self._register(server, again=True)
            self._kubelet_restarting = bool(self._registering)

    async def check_kubelet(self, trigger: str) -> None:
        """Re-register when kubelet.sock is a new file or one of our sockets has gone."""
        identity = self._kubelet_socket_identity()
        if identity is None:
            return  # the kubelet is down; its new socket will trigger this check again
        missing = [n for n, s in self._servers.items() if s.serving and not s.socket_path.exists()]
        if identity != self._kubelet_identity or missing:
            self._kubelet_identity = identity
            await self.kubelet_restarted(
                trigger if not missing else f"{trigger}: {missing[0]} gone"
            )

    def our_sockets(self) -> set[str]:
        """File names of the sockets our servers listen on."""
        return {server.socket_path.name for server in self._servers.values()}

    def _kubelet_socket_identity(self) -> tuple[int, int] | None:
        """(inode, ctime) of kubelet.sock, to tell a re-created socket from the old one."""
        try:
            st = os.stat(self.settings.kubelet_dir / KUBELET_SOCKET)
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    async def health_changed(self, change: HealthChange) -> None:
        """Apply one health transition reported by the monitor."""
        async with self._lock:
            if change.healthy:
                if self._unhealthy.pop(change.uuid, None) is None:
                    return
            elif self._unhealthy.get(change.uuid) == change.reason:
                return
            else:
                self._unhealthy[change.uuid] = change.reason
            ids = [
                device.id
                for resource in self._planned.values()
                for device in resource.devices
                if change.uuid in (device.physical_uuid, device.gpu_uuid)
            ]
            event = "device.recovered" if change.healthy else "device.unhealthy"
            level = logging.INFO if change.healthy else logging.WARNING
            log_event(
                logger,
                event,
                level,
                uuid=change.uuid,
                xid=change.xid,
                reason=change.reason,
                ids=ids,
            )
            await self._reconcile()

    # --- internals ------------------------------------------------------------------------------

    def _read_config(self) -> tuple[ParsedConfig, str]:
        text = self._read_text()
        return self._parse(text), text

    def _read_text(self) -> str:
        """The config file's content; "" without a config file."""
        path = self.settings.config_file
        if not path:
            return ""
        try:
            return Path(path).read_text()
        except OSError as exc:
            raise ConfigError("", f"cannot read config file {path}: {exc.strerror}") from None

    def _parse(self, text: str) -> ParsedConfig:
        """The file's content with flag and environment overrides applied."""
        return load_config_text(
            text, self.settings.config_file, self.settings.overrides, self.settings.env
        )

    def _adopt_config(self, parsed: ParsedConfig, text: str) -> None:
        self._parsed, self._config_text, self._rejected_text = parsed, text, None
        self._last_config_error = None
        if self._allocator is None:
            self._allocator = NodeAllocator(parsed.config, self._inventory)
        else:
            self._allocator.configure(parsed.config, self._inventory)
        for warning in parsed.warnings:
            log_event(logger, "config.warning", logging.WARNING, detail=warning)
        log_event(
            logger,
            "config.applied",
            source=self.settings.config_file or "defaults",
            config=parsed.config.model_dump(mode="json", by_alias=True),
        )

    def _reject(self, trigger: str, exc: Exception, text: str) -> None:
        self._rejected_text = text
        self._last_config_error = str(exc)
        self.metrics.config_reloads.labels("rejected").inc()
        path = exc.path if isinstance(exc, ConfigError) else ""
        log_event(
            logger,
            "config.rejected",
            logging.ERROR,
            trigger=trigger,
            field=path,
            error=str(exc),
            keeping="last good config",
        )

    def _discover(self) -> Inventory | None:
        if self._nvml is None:
            return None
        return discover(self._nvml)

    def _start_monitor(self) -> None:
        if self._nvml is None or self._inventory is None:
            return
        loop = asyncio.get_running_loop()
        env = self.settings.env

        def report(change: HealthChange) -> None:
            loop.call_soon_threadsafe(lambda: loop.create_task(self.health_changed(change)))

        self._monitor = HealthMonitor(
            self._nvml,
            self._inventory,
            HealthPolicy.from_env(env),
            report,
            recovery_after=parse_duration(self.settings.health_recovery_after),
            metrics=self.metrics,
        )
        self._monitor.start()

    async def _reconcile(self) -> None:
        """Diff the desired resource sets against the running servers and apply the difference."""
        desired = apply_health(self._planned, self._unhealthy)
        for name in [n for n in self._servers if n not in desired]:
            removed = self._servers.pop(name)
            task = self._registering.pop(name, None)
            if task is not None:
                task.cancel()
            self._registered.discard(name)
            await removed.stop(STOP_GRACE_SECONDS)
            log_event(logger, "plugin.removed", resource=name, socket=removed.socket_path.name)
        for name, resource in desired.items():
            running = self._servers.get(name)
            if running is not None:
                if await running.update(resource):
                    log_event(
                        logger,
                        "plugin.updated",
                        resource=name,
                        devices=len(resource.devices),
                        healthy=sum(d.healthy for d in resource.devices),
                    )
                continue
            server = PluginServer(
                resource,
                self.settings.kubelet_dir,
                self._allocator_or_fail(),
                observer=self.metrics,
            )
            await server.start()
            self._servers[name] = server
            self._register(server, again=False)
        self.metrics.set_resources(desired)

    def _allocator_or_fail(self) -> NodeAllocator:
        if self._allocator is None:
            raise RuntimeError("no config adopted before serving")
        return self._allocator

    def _register(self, server: PluginServer, again: bool) -> None:
        name = server.name
        kubelet_dir = self.settings.kubelet_dir

        async def run() -> None:
            failed = self.metrics.registration_failures.labels(name).inc
            await register_until_done(kubelet_dir, server.socket_path.name, name, on_failure=failed)
            self._registered.add(name)
            self._registering.pop(name, None)
            if not self._registering:
                self._kubelet_restarting = False
            self.metrics.registrations.labels(name, "again" if again else "first").inc()
            resource = server.resource
            log_event(
                logger,
                "plugin.registered",
                resource=name,
                socket=server.socket_path.name,
                devices=len(resource.devices),
                healthy=sum(d.healthy for d in resource.devices),
            )

        self._registering[name] = asyncio.get_running_loop().create_task(run())
