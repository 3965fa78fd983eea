"""The composition root: owns the running state and reconciles it with the desired state.

Desired state = resources.build_plan(inventory, config) with health applied. Every trigger —
start, config change, SIGHUP, health event, MIG re-cut, kubelet restart — recomputes it and
goes through one reconcile step: unchanged servers are left alone, changed ones push a new
list on their live stream, removed ones stop (socket removed), new ones start and register.
Only a kubelet restart re-registers everything. The MPS control daemons of MPS-shared resources
(`node.mpsdaemon`) follow the same step, before the servers: started, restarted when their
limits change, stopped when MPS goes; a daemon that is down makes its resource's devices
Unhealthy until a periodic check has started it again. Devices that prepared DRA claims still
hold (`draholds`: read at start and by the periodic check) are Unhealthy until the kubelet no
longer reports the claims. All state lives on one asyncio loop; worker
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
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deviceplugin.kubelet.registrar import Registrar
from deviceplugin.kubelet.registration import pod_resources_socket
from deviceplugin.kubelet.responder import NodeAllocator
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.model.allocation import AllocateOptions
from deviceplugin.model.config import Config, ParsedConfig
from deviceplugin.model.devices import Inventory
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import log_event
from deviceplugin.model.mps import daemon_specs, with_daemons_down
from deviceplugin.model.record import record
from deviceplugin.model.resources import Plan, ResourceSet, apply_health, build_plan
from deviceplugin.node.health import HealthChange
from deviceplugin.node.hostdevices import HostDevices
from deviceplugin.node.mpsdaemon import CONTROL_PROGRAM, MpsControl, MpsDaemons, control_program
from deviceplugin.ops.metrics import Metrics
from deviceplugin.plugin.cdispec import CdiSpecKeeper
from deviceplugin.plugin.draholds import DraHolds, HeldIds, withhold
from deviceplugin.runtime.background import spawn
from deviceplugin.runtime.engine import STOP_GRACE_SECONDS, NodeEngine
from deviceplugin.runtime.host import Simulator
from deviceplugin.runtime.options import ServeOptions

if TYPE_CHECKING:
    from deviceplugin.ops.http import HttpServer
    from deviceplugin.ops.status import Status

logger = logging.getLogger(__name__)

# How long a registered server may go without the kubelet's ListAndWatch stream before it
# registers again (a re-registration or a kubelet restart opens a new one well within it).
UNWATCHED_SECONDS = 1.0

MPS_CHECK_SECONDS = 5.0  # how often each MPS control daemon is asked whether it still serves


@record(frozen=True)
class Desired:
    """What a config makes of an inventory, computed before anything changes."""

    options: AllocateOptions
    plan: Plan | None  # None without NVML


class Supervisor:
    """Runs the plugin over the node engine: servers per resource, registration, reloads."""

    def __init__(
        self,
        settings: ServeOptions,
        metrics: Metrics | None = None,
        simulator: Simulator | None = None,
        mps_check_seconds: float = MPS_CHECK_SECONDS,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.engine = NodeEngine(settings, self.metrics, simulator)
        self._planned: dict[str, ResourceSet] = {}
        self._servers: dict[str, PluginServer] = {}
        self._socket_names: frozenset[str] = frozenset()  # read by watcher threads
        self._registrar = Registrar(settings.kubelet_dir, self.metrics)
        self._allocator = NodeAllocator(Config())  # configured by every adopted config
        self._cdi = CdiSpecKeeper(settings.cdi_spec_dir, self.engine.proc_root)
        self._mps = MpsDaemons(self._set_compute_mode)
        self._mps_check_seconds = mps_check_seconds
        self._mps_checks: asyncio.Task[None] | None = None
        self._holds = DraHolds(pod_resources_socket(settings.kubelet_dir))
        self._held: HeldIds = {}  # what the last reconcile withheld for DRA claims
        self._started = False

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load config, discover, serve and register. Raises ConfigError / DiscoveryError /
        NvmlError for start-up failures that `program` turns into exit codes."""
        engine = self.engine
        parsed, text = await engine.open_config()
        if engine.host is not None:  # Allocate and the CDI spec read the simulated host's files
            self._allocator = NodeAllocator(Config(), host=HostDevices(engine.proc_root))
            self._cdi = CdiSpecKeeper(self.settings.cdi_spec_dir, engine.proc_root)
        options = AllocateOptions.from_config(parsed.config)
        engine.adopt_first_config(parsed, text)
        self._configure(parsed, options)
        config = parsed.config
        self._prepare_kubelet_dir()
        if not engine.open_nvml(
            config, "failOnInitError is false: advertising nothing, watching config"
        ):
            self._cdi.sync(None, config)
            self._started = True
            return
        inventory = await engine.discover_first()
        self._use_plan(inventory, await self._plan(inventory, config))
        reported = await self._holds.read()  # no GPU others hold is ever advertised Healthy

        async def first() -> None:
            self._cdi.sync(engine.inventory, config)  # every CDI name defined before registering
            if reported is not None:
                self._holds.adopt(reported, engine.inventory)
            await self._reconcile()

        await engine.change(first, None)
        await self._registrar.underway()  # health and the watches start while the kubelet dials
        engine.start_health(self._health_changed)
        self._mps_checks = spawn(self._check_mps_daemons(), "MPS daemon checks")
        self._started = True

    async def stop(self) -> None:
        """Stop health monitoring and every server (sockets removed), the MPS control daemons
        (compute mode DEFAULT again), then NVML."""
        if self._mps_checks is not None:
            self._mps_checks.cancel()

        async def stop_servers() -> None:
            self._registrar.forget_all()
            await asyncio.gather(*(s.stop(STOP_GRACE_SECONDS) for s in self._servers.values()))
            self._servers.clear()
            await self._mps.stop_all()

        await self.engine.shutdown(stop_servers)
        log_event(logger, "plugin.stopped")

    def endpoints(self, address: str) -> HttpServer:
        """/healthz, /readyz, /metrics, /status and the pods holding devices on `address`."""
        # The HTTP stack and the pod-resources client only for a plugin that serves HTTP.
        from deviceplugin.kubelet.pods import read_pods
        from deviceplugin.ops.http import HttpServer

        return HttpServer(address, self, self._holds.socket, read_pods=read_pods)

    def status(self) -> Status:
        from deviceplugin.ops.status import Status  # read by /readyz, /status and inspect only

        return Status(
            core=self.engine.core_status(self._started),
            resources=self.resources,
            registered=self._registrar.registered,
            kubelet_restarting=self._registrar.restarting,
            cdi_spec_error=self._cdi.error,
            dra_holds=self._holds.document(self._held),
        )

    @property
    def resources(self) -> dict[str, ResourceSet]:
        """What each running server advertises, by resource name."""
        return {name: server.resource for name, server in self._servers.items()}

    @property
    def config(self) -> Config:
        return self.engine.config

    @property
    def inventory(self) -> Inventory | None:
        """The node's devices as last discovered; None before discovery or without NVML."""
        return self.engine.inventory

    # --- triggers: each a change on the engine's serialized path ---------------------------------

    async def reload(
        self, trigger: str, force: bool = False, config_path: str | None = None
    ) -> bool:
        """Re-read the config (from `config_path` when the node's label chose another) and
        rediscover; apply only a valid result. True when applied."""
        return await self.engine.reload(trigger, force, self, config_path)

    async def rediscover(self) -> bool:
        """Re-read the inventory (a MIG re-cut, a GPU gone); reconcile if it changed."""
        return await self.engine.rediscover(self)

    async def retry_cdi_spec(self) -> bool:
        """Try again to write the CDI spec whose last write failed; True when it is in place."""
        if self._cdi.error is None:  # the common case: no change queued every few seconds
            return True

        async def retry() -> bool:
            if self._cdi.error is None:
                return True
            return self._cdi.sync(self.engine.inventory, self.config)

        return await self.engine.change(retry, self._cdi.error is None)

    async def kubelet_restarted(self, trigger: str) -> None:
        """Serve again where our sockets are gone and register everything again."""
        await self.engine.change(lambda: self._registrar.reregister(self._servers, trigger), None)

    async def check_kubelet(self, trigger: str) -> None:
        """Re-register when kubelet.sock is a new file or one of our sockets has gone, and a
        registered server the kubelet stopped watching (`PluginServer.unwatched_for`)."""

        async def check() -> None:
            reason = self._registrar.restart_needed(self._servers)
            if reason is not None:
                await self._registrar.reregister(self._servers, f"{trigger}: {reason}")
                self._note_socket_names()  # a server may have bound a name beside another
                return
            registered = self._registrar.registered
            for name, server in self._servers.items():
                unwatched = server.unwatched_for()
                if name in registered and unwatched >= UNWATCHED_SECONDS and server.alone():
                    log_event(
                        logger,
                        "plugin.unwatched",
                        logging.WARNING,
                        resource=name,
                        seconds=round(unwatched, 1),
                        hint="the kubelet dropped its ListAndWatch stream: registering again",
                    )
                    server.registered_again()
                    self._registrar.register(server, again=True)

        await self.engine.change(check, None)

    def _unwatched(self, name: str) -> None:
        """A server's last ListAndWatch stream ended: check once a new one had time to open
        (a re-registration of ours opens one at once; a kubelet restart is seen as one)."""

        async def later() -> None:
            await asyncio.sleep(UNWATCHED_SECONDS)
            await self.check_kubelet(f"ListAndWatch of {name} ended")

        spawn(later(), "unwatched check")

    async def check_dra_holds(self) -> None:
        """Follow what prepared DRA claims hold: one List of the kubelet's PodResources, off
        the serialized path (it waits on the kubelet); a change is applied on it."""
        if self.engine.inventory is None:  # nothing advertised, nothing to withhold
            return
        reported = await self._holds.read()
        if reported is None:
            return

        async def apply() -> None:
            if self._holds.adopt(reported, self.engine.inventory):
                await self._reconcile()

        await self.engine.change(apply, None)

    def _note_socket_names(self) -> None:
        self._socket_names = frozenset(s.socket_path.name for s in self._servers.values())

    def our_sockets(self) -> frozenset[str]:
        """File names of our sockets; safe to call from a watcher thread."""
        return self._socket_names

    # --- the changes ------------------------------------------------------------------------------

    async def plan(self, config: Config, inventory: Inventory | None) -> Desired:
        """The allocation options and resources `config` makes of `inventory` (Planner)."""
        options = AllocateOptions.from_config(config)  # unusable ones are refused
        plan = await self._plan(inventory, config) if inventory is not None else None
        return Desired(options, plan)

    async def adopt(self, desired: Desired) -> None:
        """Serve what `plan` computed: the engine holds the new config and inventory."""
        engine = self.engine
        if engine.inventory is not None and desired.plan is not None:
            self._use_plan(engine.inventory, desired.plan)
        assert engine.parsed is not None
        self._configure(engine.parsed, desired.options)
        self._cdi.sync(engine.inventory, engine.config)
        self._holds.remap(engine.inventory)  # a MIG re-cut moves what a claim's device names
        await self._reconcile()

    async def _health_changed(self, change: HealthChange) -> Mapping[str, Any]:
        """Advertise one health transition the engine recorded; the IDs it touched."""
        ids = [
            device.id
            for resource in self._planned.values()
            for device in resource.devices
            if change.uuid in (device.physical_uuid, device.gpu_uuid)
        ]
        await self._reconcile()
        return {"ids": ids}

    # --- internals ------------------------------------------------------------------------------

    async def _plan(self, inventory: Inventory, config: Config) -> Plan:
        """The resources `config` makes of `inventory`: a config of thousands of rules takes
        seconds to apply, so it is applied off the loop too. MPS-shared resources need the
        driver root's control program (ConfigError naming the driver root otherwise)."""
        plan = await self.engine.config_file.step(
            lambda: build_plan(inventory, config), "planning from"
        )
        if any(resource.mps for resource in plan.resources.values()):
            control_program(config.flags.nvidia_driver_root)
        return plan

    async def _set_compute_mode(self, uuid: str, mode: int) -> None:
        nvml = self.engine.nvml
        assert nvml is not None  # MPS resources come from an inventory, which needs NVML
        await asyncio.to_thread(nvml.set_compute_mode, uuid, mode)

    async def _apply_mps(self) -> None:
        """Start, restart or stop the control daemons the planned resources need."""
        config, inventory = self.engine.config, self.engine.inventory
        specs = daemon_specs(self._planned, inventory, config.flags.mps_root) if inventory else {}
        program = Path(config.flags.nvidia_driver_root) / CONTROL_PROGRAM
        await self._mps.apply(specs, MpsControl(program) if specs else None)

    async def _check_mps_daemons(self) -> None:
        """Every few seconds: each control daemon still serving, or Unhealthy and restarted."""

        async def check() -> None:
            if await self._mps.check():
                await self._reconcile()

        while True:
            await asyncio.sleep(self._mps_check_seconds)
            if self._mps.running:
                await self.engine.change(check, None)

    def _configure(self, parsed: ParsedConfig, options: AllocateOptions) -> None:
        self._allocator.configure(
            options, parsed.config.flags.plugin.shared_devices_allocation_policy
        )

    def _use_plan(self, inventory: Inventory, plan: Plan) -> None:
        """Make the resources planned from `inventory` the desired state."""
        self._planned = dict(plan.resources)
        self._allocator.use_inventory(inventory)
        for warning in plan.warnings:
            log_event(logger, "resources.skipped", logging.WARNING, detail=warning)

    def _prepare_kubelet_dir(self) -> None:
        directory = self.settings.kubelet_dir
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("--kubelet-dir", f"cannot use {directory}: {exc.strerror}") from None

    async def _reconcile(self) -> None:
        """Diff the desired resource sets against the running servers and apply the difference."""
        await self._apply_mps()
        healthy = apply_health(self._planned, self.engine.unhealthy)
        self._held = self._holds.held_ids(self._planned)
        desired = withhold(with_daemons_down(healthy, self._mps.down), self._held)
        for name in [n for n in self._servers if n not in desired]:
            removed = self._servers.pop(name)
            self._registrar.forget(name)
            await removed.stop(STOP_GRACE_SECONDS)
            log_event(logger, "plugin.removed", resource=name, socket=removed.socket_path.name)
        started: list[PluginServer] = []
        try:
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
                    on_unwatched=self._unwatched,
                )
                await server.start()
                self._servers[name] = server
                started.append(server)
        finally:  # every new server serves before the first Register leaves; each that serves
            for server in started:  # is registered, even when a later one failed to start
                self._registrar.register(server)
        self._note_socket_names()
        self.metrics.set_resources(desired)
        self.metrics.set_held_by_dra(desired, self._held)
