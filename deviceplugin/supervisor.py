"""The composition root: owns the running state and reconciles it with the desired state.

Desired state = resources.build_plan(inventory, config) with health applied. Every trigger —
start, config change, SIGHUP, health event, MIG re-cut, kubelet restart — recomputes it and
goes through one reconcile step: unchanged servers are left alone, changed ones push a new
list on their live stream, removed ones stop (socket removed), new ones start and register.
Only a kubelet restart re-registers everything. All state lives on one asyncio loop; worker
threads (NVML event wait, file watchers) hand work to it with call_soon_threadsafe.

The config file is untrusted input: it is read, parsed and planned from off the loop, each step
with a time limit (`offloop.OffLoop`), so a FIFO, a huge file or a stuck file system never stops
Allocate, `/healthz` or SIGTERM. A file refused at a reload leaves the last good config in force
and is reported where operators look: `/status`, `deviceplugin_config_last_reload_successful`
and a `config.rejected` line at error level naming the file and the field. `configfile` does that
part, for `dra serve` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from deviceplugin.cdispec import CdiSpecKeeper
from deviceplugin.cli import Settings
from deviceplugin.kubelet.registrar import Registrar
from deviceplugin.kubelet.responder import NodeAllocator
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.model.allocation import AllocateOptions
from deviceplugin.model.config import Config, ParsedConfig, load_config_text
from deviceplugin.model.devices import Inventory, keep_unhealthy_gpus
from deviceplugin.model.errors import ConfigError, DevicePluginError, DiscoveryError, NvmlError
from deviceplugin.model.log import log_event
from deviceplugin.model.resources import Plan, ResourceSet, apply_health, build_plan
from deviceplugin.node.discovery import discover
from deviceplugin.node.health import (
    HealthChange,
    HealthMonitor,
    HealthPolicy,
    parse_duration,
    record_change,
)
from deviceplugin.node.hostdevices import HostDevices
from deviceplugin.node.nvml import Nvml
from deviceplugin.ops.metrics import Metrics
from deviceplugin.runtime.background import spawn
from deviceplugin.runtime.configfile import ConfigFile
from deviceplugin.runtime.host import SimulatedHost, open_host_config, open_nvml, proc_root

if TYPE_CHECKING:
    from deviceplugin.ops.status import Status

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 1.0


class Supervisor:
    """Runs the plugin: servers per resource, registration, health, reloads."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._parsed: ParsedConfig | None = None
        self._config_file = ConfigFile(settings.config_file, self.metrics)
        self._nvml: Nvml | None = None
        self._inventory: Inventory | None = None
        self._planned: dict[str, ResourceSet] = {}
        self._unhealthy: dict[str, str] = {}
        self._servers: dict[str, PluginServer] = {}
        self._socket_names: frozenset[str] = frozenset()  # read by watcher threads
        self._registrar = Registrar(settings.kubelet_dir, self.metrics)
        self._monitor: HealthMonitor | None = None
        self._overrides: Mapping[str, str | None] = settings.overrides
        self._host: SimulatedHost | None = None  # the simulated node's host files
        self._allocator = NodeAllocator(Config())  # configured by every adopted config
        self._cdi = CdiSpecKeeper(settings.cdi_spec_dir, proc_root(None))
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self._stopping = False
        self._started = False
        # with --config-dir: what the node's config selection reports in /status
        self.selection_view: Callable[[], Mapping[str, Any]] | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load config, discover, serve and register. Raises ConfigError / DiscoveryError /
        NvmlError for start-up failures that `__main__` turns into exit codes."""
        policy = HealthPolicy.from_env(self.settings.env)
        recovery_after = parse_duration(self.settings.health_recovery_after)
        text = await self._config_file.read()
        parsed = await self._open_host(text)
        self._adopt_config(parsed, text, AllocateOptions.from_config(parsed.config), False)
        config = parsed.config
        self._prepare_kubelet_dir()
        try:
            self._nvml = open_nvml(
                self.settings.simulate,
                self.settings.simulate_events,
                config.flags.nvidia_driver_root,
            )
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
            self._cdi.sync(None, config)
            self._started = True
            return
        inventory = await asyncio.to_thread(discover, self._nvml)
        self.metrics.set_driver_version(inventory.driver_version)
        self._adopt_inventory(inventory, await self._plan(inventory, config))
        async with self._lock:
            self._cdi.sync(self._inventory, config)  # every CDI name defined before registering
            await self._reconcile()
        self._start_monitor(policy, recovery_after)
        self._started = True

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopping = True
        self._stopped.set()

    async def shutdown(self) -> None:
        """Stop health monitoring and every server (sockets removed), then NVML."""
        if self._monitor is not None:
            await asyncio.to_thread(self._monitor.stop)
        self._stopping = True
        async with self._lock:
            self._registrar.forget_all()
            await asyncio.gather(*(s.stop(STOP_GRACE_SECONDS) for s in self._servers.values()))
            self._servers.clear()
        if self._nvml is not None:
            with contextlib.suppress(DevicePluginError):
                self._nvml.shutdown()
        if self._host is not None:  # the CDI spec stays: running containers are defined by it
            self._host.close()
        log_event(logger, "plugin.stopped")

    def status(self) -> Status:
        from deviceplugin.ops.status import Status  # read by /readyz, /status and inspect only

        return Status(
            resources=self.resources,
            registered=self._registrar.registered,
            health_monitor_alive=self._monitor is not None and self._monitor.alive,
            nvml_available=self._nvml is not None,
            kubelet_restarting=self._registrar.restarting,
            config_source=self._config_file.path,
            last_config_error=self._config_file.last_error,
            last_config_error_field=self._config_file.last_error_field,
            started=self._started,
            cdi_spec_error=self._cdi.error,
            config_selection=self.selection_view() if self.selection_view else None,
        )

    @property
    def resources(self) -> dict[str, ResourceSet]:
        """What each running server advertises, by resource name."""
        return {name: server.resource for name, server in self._servers.items()}

    @property
    def config(self) -> Config:
        return self._parsed.config if self._parsed else Config()

    @property
    def inventory(self) -> Inventory | None:
        """The node's devices as last discovered; None before discovery or without NVML."""
        return self._inventory

    def use_config_file(self, path: str) -> None:
        """Read the config from `path` from now on (the node's named config): the next reload
        applies it, or refuses it and keeps the config in force."""
        self._config_file.path = path

    # --- triggers ---------------------------------------------------------------------------------

    async def reload(self, trigger: str, force: bool = False) -> bool:
        """Re-read the config and rediscover; apply only a valid result. True when applied."""
        async with self._lock:
            if self._stopping:
                return False
            content = await self._config_file.changed(trigger, force)
            if content is None:
                return False
            text = content.text
            try:
                parsed = await self._config_file.step(lambda: self._parse(text), "parsing")
                options = AllocateOptions.from_config(parsed.config)  # unusable ones are refused
                inventory = await self._discover()
                plan = await self._plan(inventory, parsed.config) if inventory else None
            except (ConfigError, DiscoveryError, NvmlError) as exc:
                self._config_file.reject(trigger, exc, text)
                return False
            if inventory is not None and plan is not None:
                self._adopt_inventory(inventory, plan)
            self._adopt_config(parsed, text, options)
            self._cdi.sync(self._inventory, parsed.config)
            await self._reconcile()
            return True

    async def rediscover(self) -> bool:
        """Re-read the inventory (a MIG re-cut, a GPU gone); reconcile if it changed."""
        async with self._lock:
            if self._stopping:
                return False
            try:
                inventory = await self._discover()
                if inventory is None or inventory == self._inventory:
                    return False
                plan = await self._plan(inventory, self.config)
            except (ConfigError, DiscoveryError, NvmlError) as exc:
                log_event(logger, "inventory.rejected", logging.WARNING, error=str(exc))
                return False
            log_event(logger, "inventory.changed", gpus=len(inventory.gpus))
            self._adopt_inventory(inventory, plan)
            self._cdi.sync(self._inventory, self.config)
            await self._reconcile()
            return True

    async def retry_cdi_spec(self) -> bool:
        """Try again to write the CDI spec whose last write failed; True when it is in place."""
        if self._cdi.error is None:  # the common case: no lock taken every few seconds
            return True
        async with self._lock:
            if self._stopping or self._cdi.error is None:
                return self._cdi.error is None
            return self._cdi.sync(self._inventory, self.config)

    async def kubelet_restarted(self, trigger: str) -> None:
        """Serve again where our sockets are gone and register everything again."""
        async with self._lock:
            if not self._stopping:
                await self._registrar.reregister(self._servers, trigger)

    async def check_kubelet(self, trigger: str) -> None:
        """Re-register when kubelet.sock is a new file or one of our sockets has gone."""
        async with self._lock:
            if self._stopping:
                return
            reason = self._registrar.restart_needed(self._servers)
            if reason is not None:
                await self._registrar.reregister(self._servers, f"{trigger}: {reason}")

    def our_sockets(self) -> frozenset[str]:
        """File names of our sockets; safe to call from a watcher thread."""
        return self._socket_names

    async def health_changed(self, change: HealthChange) -> None:
        """Apply one health transition reported by the monitor."""
        async with self._lock:
            if self._stopping:
                return
            if not record_change(self._unhealthy, change):
                return
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

    def _parse(self, text: str | None) -> ParsedConfig:
        """The file's content with flag and environment overrides applied."""
        return load_config_text(text, self._config_file.path, self._overrides, self.settings.env)

    async def _plan(self, inventory: Inventory, config: Config) -> Plan:
        """The resources `config` makes of `inventory`: a config of thousands of rules takes
        seconds to apply, so it is applied off the loop too."""
        return await self._config_file.step(lambda: build_plan(inventory, config), "planning from")

    async def _open_host(self, text: str | None) -> ParsedConfig:
        """`text` parsed, with the simulated node's host files opened under `--simulate`:
        Allocate and the CDI spec then read device nodes, mig-minors and driver files there."""
        settings, source = self.settings, self._config_file.path
        parsed, self._host, self._overrides = await self._config_file.step(
            lambda: open_host_config(
                settings.simulate,
                settings.overrides,
                lambda overrides: load_config_text(text, source, overrides, settings.env),
            ),
            "parsing",
        )
        if self._host is not None:
            self._allocator = NodeAllocator(Config(), host=HostDevices(self._host.proc_root))
            self._cdi = CdiSpecKeeper(settings.cdi_spec_dir, self._host.proc_root)
        return parsed

    def _adopt_config(
        self,
        parsed: ParsedConfig,
        text: str | None,
        options: AllocateOptions,
        reloaded: bool = True,
    ) -> None:
        self._parsed = parsed
        self._allocator.configure(
            options, parsed.config.flags.plugin.shared_devices_allocation_policy
        )
        self._config_file.adopt(parsed, text, reloaded)

    def _adopt_inventory(self, inventory: Inventory, plan: Plan) -> None:
        """Make a new inventory, and the resources planned from it, the desired state."""
        self._inventory = inventory
        self._planned = dict(plan.resources)
        self._allocator.use_inventory(inventory)
        if self._monitor is not None:
            self._monitor.update_inventory(inventory)
        for warning in plan.warnings:
            log_event(logger, "resources.skipped", logging.WARNING, detail=warning)

    async def _discover(self) -> Inventory | None:
        """Rediscover off the event loop (NVML calls block); a GPU that was marked Unhealthy and
        no longer answers stays in the inventory, so its IDs stay advertised as Unhealthy
        instead of vanishing from the kubelet's view."""
        if self._nvml is None:
            return None
        found = await asyncio.to_thread(discover, self._nvml)
        return keep_unhealthy_gpus(self._inventory, found, self._unhealthy)

    def _prepare_kubelet_dir(self) -> None:
        directory = self.settings.kubelet_dir
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("--kubelet-dir", f"cannot use {directory}: {exc.strerror}") from None

    def _start_monitor(self, policy: HealthPolicy, recovery_after: float | None) -> None:
        if self._nvml is None or self._inventory is None:
            return
        loop = asyncio.get_running_loop()

        def report(change: HealthChange) -> None:
            loop.call_soon_threadsafe(spawn, self.health_changed(change), "health change")

        self._monitor = HealthMonitor(
            self._nvml, self._inventory, policy, report, recovery_after, observer=self.metrics
        )
        self._monitor.start()

    async def _reconcile(self) -> None:
        """Diff the desired resource sets against the running servers and apply the difference."""
        desired = apply_health(self._planned, self._unhealthy)
        for name in [n for n in self._servers if n not in desired]:
            removed = self._servers.pop(name)
            self._registrar.forget(name)
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
                        healthy=resource.healthy_count,
                    )
                continue
            server = PluginServer(
                resource,
                self.settings.kubelet_dir,
                self._allocator,
                observer=self.metrics,
            )
            await server.start()
            self._servers[name] = server
            self._registrar.register(server)
        self._socket_names = frozenset(s.socket_path.name for s in self._servers.values())
        self.metrics.set_resources(desired)
