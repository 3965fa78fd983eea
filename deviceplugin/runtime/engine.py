"""The node engine: what the device plugin and the DRA driver both run on, written once.

It owns NVML (opened with the config's driver root; `failOnInitError` decides between raising
and idling), discovery and rediscovery (a GPU marked unhealthy that stops answering stays in
the inventory, so it stays listed as unhealthy instead of vanishing), the health monitor and the
map of unhealthy devices it feeds, the simulated host of `--simulate`, the config file, and
shutdown. A daemon composes over it: it reads the engine's inventory, config and health, and
turns them into what it serves (the device plugin's servers, the DRA driver's slices and
Prepare).

Every state change of a daemon goes through one serialized path, `change`: a reload, a
rediscovery, a health change and the periodic checks each run to their end before the next
begins, so no change acts on state another has replaced while it waited (a rediscovery that
was scanning the host when a reload was adopted cannot hand Prepare or ListAndWatch devices
built from the previous config). Nothing runs there once shutdown has begun, and nothing there
waits on the network: a daemon hands API writes to tasks of its own (the DRA publisher).

One error policy for both daemons: a reload or a rediscovery computes everything first (the
config parsed, the node read, the daemon's `Planner.plan`), and only a complete, valid result
is adopted (`Planner.adopt`); anything else is refused (`config.rejected`,
`inventory.rejected`) and the last good state stays. `config.applied` is logged by
`configfile`, and `inventory.changed` and `device.*` here, for both daemons.

The engine holds the one stop request of its daemon (`request_stop`, `wait_stopped`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from deviceplugin.model.config import Config, ParsedConfig, load_config_text
from deviceplugin.model.devices import Inventory, keep_unhealthy_gpus
from deviceplugin.model.errors import ConfigError, DevicePluginError, DiscoveryError, NvmlError
from deviceplugin.model.log import log_event
from deviceplugin.node.discovery import discover
from deviceplugin.node.health import (
    HealthChange,
    HealthMonitor,
    HealthPolicy,
    parse_duration,
    record_change,
)
from deviceplugin.node.nvml import Nvml
from deviceplugin.node.xidcatalog import policy_from_env
from deviceplugin.ops.corestatus import CoreStatus
from deviceplugin.ops.metrics import SharedMetrics
from deviceplugin.runtime.background import spawn
from deviceplugin.runtime.configfile import ConfigFile
from deviceplugin.runtime.host import (
    Overrides,
    SimulatedHost,
    Simulator,
    open_host_config,
    open_nvml,
    proc_root,
)
from deviceplugin.runtime.options import EngineOptions

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 1.0  # how long a stopping gRPC server lets calls in flight finish
SOCKET_CHECK_SECONDS = 5.0  # the cheap periodic checks (sockets, CDI spec, the other allocator)
REDISCOVER_SECONDS = 60.0  # how often the node is read again (a MIG re-cut, a GPU gone)
SHUTDOWN_WAIT_SECONDS = 10.0  # how long shutdown waits for the change in flight to end

T = TypeVar("T")
P = TypeVar("P")

# What a reload or rediscovery may fail with: the result is refused, the last good state stays.
REFUSALS = (ConfigError, DiscoveryError, NvmlError, OSError)

HealthApply = Callable[[HealthChange], Awaitable[Mapping[str, Any]]]


class Planner(Protocol, Generic[P]):
    """What a daemon makes of a config and an inventory: computed first, adopted after."""

    async def plan(self, config: Config, inventory: Inventory | None) -> P:
        """Everything the daemon needs to serve `config` on `inventory`, computed, nothing
        changed yet. Raises one of REFUSALS to refuse it."""
        ...

    async def adopt(self, plan: P) -> None:
        """Serve `plan` (the engine's config and inventory are already the new ones). Must not
        fail for reasons `plan` could have found."""
        ...


class NodeEngine:
    """The node as both daemons see it; one per running daemon."""

    def __init__(
        self, options: EngineOptions, metrics: SharedMetrics, simulator: Simulator | None = None
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.simulator = simulator  # the simulated node of `--simulate`; None on a real one
        self.config_file = ConfigFile(options.config_file, metrics)
        self.nvml: Nvml | None = None
        self.inventory: Inventory | None = None  # as last discovered; None without NVML
        self.unhealthy: dict[str, str] = {}  # device UUID -> why it is unhealthy
        self.host: SimulatedHost | None = None  # the simulated node's host files
        self.stopping = False
        self._overrides: Overrides = options.overrides
        self._monitor: HealthMonitor | None = None
        self._policy = HealthPolicy()
        self._recovery_after: float | None = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self.parsed: ParsedConfig | None = None  # the config in force
        # with --config-dir: what the node's config selection reports in /status
        self.selection_view: Callable[[], Mapping[str, Any]] | None = None

    @property
    def config(self) -> Config:
        return self.parsed.config if self.parsed else Config()

    # --- the stop request -----------------------------------------------------------------------

    def request_stop(self) -> None:
        """SIGTERM: no change begins after this, and `wait_stopped` returns."""
        self.stopping = True
        self._stop.set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    # --- start-up -------------------------------------------------------------------------------

    async def open_config(self) -> tuple[ParsedConfig, str | None]:
        """The config in force at start-up and the file's text: the health settings checked,
        the file read and parsed off the loop, and under `--simulate` the simulated node's host
        files opened (reloads then keep pointing at them). Raises ConfigError."""
        options = self.options
        self._policy = policy_from_env(options.env)
        self._recovery_after = parse_duration(options.health_recovery_after)
        text = await self.config_file.read()
        source = self.config_file.path
        parsed, self.host, self._overrides = await self.config_file.step(
            lambda: open_host_config(
                self.simulator,
                options.overrides,
                lambda overrides: load_config_text(text, source, overrides, options.env),
            ),
            "parsing",
        )
        return parsed, text

    def adopt_first_config(self, parsed: ParsedConfig, text: str | None) -> None:
        """The config start-up found is in force (not counted as a reload)."""
        self.parsed = parsed
        self.config_file.adopt(parsed, text, reloaded=False)

    def open_nvml(self, config: Config, idle_hint: str) -> bool:
        """Open and initialise NVML; False (logged with `idle_hint`) when it is unavailable and
        `failOnInitError` is false. Raises NvmlError when it is true."""
        try:
            nvml = open_nvml(
                self.simulator,
                self.options.simulate_events,
                config.flags.nvidia_driver_root,
            )
            nvml.init()
        except NvmlError as exc:
            if config.flags.fail_on_init_error:
                raise
            log_event(
                logger,
                "nvml.unavailable",
                logging.WARNING,
                error=str(exc),
                hint=idle_hint,
            )
            return False
        self.nvml = nvml
        return True

    async def discover_first(self) -> Inventory:
        """The node's first inventory, now the engine's."""
        assert self.nvml is not None
        inventory = await asyncio.to_thread(self._discover, self.nvml)
        self.metrics.set_driver_version(inventory.driver_version)
        self.inventory = inventory
        return inventory

    def start_health(self, apply: HealthApply) -> None:
        """Watch the inventory's devices; each transition that changes the unhealthy map is
        handed to `apply` on the serialized path, then logged (`device.unhealthy`,
        `device.recovered`) with what `apply` adds."""
        if self.nvml is None or self.inventory is None:
            return
        loop = asyncio.get_running_loop()

        def report(change: HealthChange) -> None:
            loop.call_soon_threadsafe(spawn, self._health_changed(change, apply), "health change")

        self._monitor = HealthMonitor(
            self.nvml,
            self.inventory,
            self._policy,
            report,
            self._recovery_after,
            observer=self.metrics,
        )
        self._monitor.start()

    # --- the serialized path --------------------------------------------------------------------

    async def change(self, apply: Callable[[], Awaitable[T]], stopped: T) -> T:
        """`apply()` alone on the state: after every change begun before it, before any begun
        after it. `stopped` instead once shutdown has begun."""
        async with self._lock:
            if self.stopping:
                return stopped
            return await apply()

    async def _health_changed(self, change: HealthChange, apply: HealthApply) -> None:
        async def step() -> None:
            if not record_change(self.unhealthy, change):
                return
            extra = await apply(change)
            log_event(
                logger,
                "device.recovered" if change.healthy else "device.unhealthy",
                logging.INFO if change.healthy else logging.WARNING,
                uuid=change.uuid,
                xid=change.xid,
                reason=change.reason,
                **extra,
            )

        await self.change(step, None)

    # --- reload and rediscovery, for both daemons -----------------------------------------------

    async def reload(
        self, trigger: str, force: bool, planner: Planner[P], config_path: str | None = None
    ) -> bool:
        """Read the config file again (from `config_path` when the node's label chose another)
        and the node with it; adopt only a complete, valid result. True when adopted."""

        async def step() -> bool:
            if config_path is not None:
                self.config_file.path = config_path
            reloaded = await self.reloaded_config(trigger, force)
            if reloaded is None:
                return False
            parsed, text = reloaded
            try:
                inventory = await self.discover()
                plan = await planner.plan(parsed.config, inventory)
            except REFUSALS as exc:
                self.config_file.reject(trigger, exc, text)
                return False
            self.parsed = parsed
            if inventory is not None:
                self._adopt_changed(inventory)
            self.config_file.adopt(parsed, text)
            await planner.adopt(plan)
            return True

        return await self.change(step, False)

    async def rediscover(self, planner: Planner[P]) -> bool:
        """Read the node again (a MIG re-cut, a GPU gone); on a change adopt it with the
        daemon's plan for it, or refuse it (`inventory.rejected`). True when adopted."""

        async def step() -> bool:
            try:
                inventory = await self.discover()
                if inventory is None or inventory == self.inventory:
                    return False
                plan = await planner.plan(self.config, inventory)
            except REFUSALS as exc:
                log_event(logger, "inventory.rejected", logging.WARNING, error=str(exc))
                return False
            self._adopt_changed(inventory)
            await planner.adopt(plan)
            return True

        return await self.change(step, False)

    def _adopt_changed(self, inventory: Inventory) -> None:
        if inventory != self.inventory:
            log_event(logger, "inventory.changed", gpus=len(inventory.gpus))
        self.adopt_inventory(inventory)

    # --- on the serialized path -----------------------------------------------------------------

    async def parse(self, text: str | None) -> ParsedConfig:
        """The config file's `text` (None: no file, the defaults) with the flags' overrides and
        the environment applied, parsed off the loop. Raises ConfigError."""
        source, overrides, env = self.config_file.path, self._overrides, self.options.env
        return await self.config_file.step(
            lambda: load_config_text(text, source, overrides, env), "parsing"
        )

    async def reloaded_config(
        self, trigger: str, force: bool
    ) -> tuple[ParsedConfig, str | None] | None:
        """The config file's content parsed, with its text, when a reload must judge it; None
        when there is nothing to judge, or the content is refused (logged and counted here).
        The caller adopts it (`config_file.adopt`) or refuses it for its own reasons."""
        content = await self.config_file.changed(trigger, force)
        if content is None:
            return None
        try:
            return await self.parse(content.text), content.text
        except ConfigError as exc:
            self.config_file.reject(trigger, exc, content.text)
            return None

    async def discover(self) -> Inventory | None:
        """The node read again off the loop (NVML calls block); None without NVML. A GPU that
        was marked unhealthy and no longer answers stays, so it stays listed as unhealthy."""
        if self.nvml is None:
            return None
        found = await asyncio.to_thread(self._discover, self.nvml)
        return keep_unhealthy_gpus(self.inventory, found, self.unhealthy)

    def _discover(self, nvml: Nvml) -> Inventory:
        """Discovery as the daemon needs it: with MIG profiles for dynamic MIG."""
        return discover(nvml, mig_profiles=self.options.reads_mig_profiles)

    def adopt_inventory(self, inventory: Inventory) -> None:
        """`inventory` is the node now; the health monitor watches its devices."""
        self.inventory = inventory
        if self._monitor is not None:
            self._monitor.update_inventory(inventory)

    # --- what operators see ---------------------------------------------------------------------

    @property
    def proc_root(self) -> str:
        """Where the kernel module's files are read: the simulated host's, or the real /proc."""
        return proc_root(self.host)

    @property
    def monitor_alive(self) -> bool:
        return self._monitor is not None and self._monitor.alive

    def core_status(self, started: bool) -> CoreStatus:
        """What both daemons' /status and /readyz share."""
        config_file = self.config_file
        return CoreStatus(
            started=started,
            config_source=config_file.path,
            last_config_error=config_file.last_error,
            last_config_error_field=config_file.last_error_field,
            config_selection=self.selection_view() if self.selection_view else None,
            nvml_available=self.nvml is not None,
            monitoring=self.inventory is not None and bool(self.inventory.gpus),
            health_monitor_alive=self.monitor_alive,
            unhealthy=dict(self.unhealthy),
        )

    # --- shutdown -------------------------------------------------------------------------------

    async def shutdown(self, stop: Callable[[], Awaitable[None]]) -> None:
        """Stop health monitoring, then `stop` the daemon's servers once the change in flight
        has ended (no change runs after; one still running after SHUTDOWN_WAIT_SECONDS is not
        waited for), then shut NVML down and remove a temporary simulated host. Also after a
        failed start."""
        if self._monitor is not None:
            await asyncio.to_thread(self._monitor.stop)
        self.stopping = True
        ended = await self._changes_ended()
        try:
            await stop()
        finally:
            if ended:
                self._lock.release()
        if self.nvml is not None:
            with contextlib.suppress(DevicePluginError):
                self.nvml.shutdown()
        if self.host is not None:  # CDI specs stay: running containers are defined by them
            self.host.close()

    async def _changes_ended(self) -> bool:
        """Hold the serialized path once the change in flight has ended: True. False when it
        is still running after SHUTDOWN_WAIT_SECONDS (a reload or health change stuck on an
        API server that does not answer must not hold SIGTERM up)."""
        try:
            await asyncio.wait_for(self._lock.acquire(), SHUTDOWN_WAIT_SECONDS)
        except TimeoutError:
            log_event(
                logger,
                "shutdown.change_pending",
                logging.WARNING,
                waited_seconds=SHUTDOWN_WAIT_SECONDS,
                hint="stopping while a reload, rediscovery or health change is still running",
            )
            return False
        return True
