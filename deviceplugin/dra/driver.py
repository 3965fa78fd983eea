"""The DRA driver: a composition over the node engine, run by `dra serve` (`dra/service.py`).

Start-up, in the order the kubelet needs it, and none of it waiting on the API server: the
config file and flags (as `serve` merges them), NVML (simulated with `--simulate`), discovery
(published as the hardware is: the device plugin's MIG strategy and sharing do not apply); the
API client (`--kubeconfig`, else in-cluster: nothing sent yet); the checkpoint; the DRA socket;
the registration socket, so the kubelet finds a driver that already answers; the health
monitor. Only then are the slices handed to the publisher, whose own task writes them, retried
for as long as the API server is down or hangs. Which gated slice fields the server keeps is
probed (`serverfeatures.py`) right after that first publish, which until then leaves out an
unhealthy device instead of tainting it; with `--mig-mode dynamic` or `--gpu-sharing memory`
the probe comes first, so partitions and shares are published only once the server is known to
keep their counters and capacity (a field it drops is one error line naming the gate, a
/status field and a reason /readyz gives). The server's version is checked with every
rediscovery and the probe made again when it changed (an API server upgrade), or when no probe
has answered yet: the kubelet side (Unprepare of checkpointed
claims, health streams, socket repair) never waits on it. Prepare of a new claim reads the claim
with the client's deadline and fails with an error the kubelet retries. The health monitor
reports Xids and recoveries, each republished at once (`healthy` turns false, and the device is
tainted unless `--unhealthy-taint off`). The slices are watched on the server and a
slice someone else deleted or changed is put back at once (`slicewatch.py`): the kubelet wipes
a node's slices when it starts and while none of the driver's plugins is registered. After each
successful registration they are listed and repaired as well.

While it runs, a cheap check every few seconds serves again on a socket that was deleted under
it (the plugin watcher then registers the driver anew), and every minute the node is
rediscovered: a MIG re-cut or a GPU gone is republished and Prepare maps to the new devices.

Without NVML, `failOnInitError: true` (the default) fails start-up; `false` idles as `serve`
does: nothing published, nothing registered, until stopped.

Operated as `serve` is: `--http-address` serves /healthz, /readyz, /metrics and /status
(`ops.http.DraEndpoints`, from `status()` and `DraMetrics`), and the config file is followed
(a ConfigMap swap, SIGHUP): a valid one is adopted and the slices republished, an invalid one
refused while the last good one stays (`reload`).

On stop both sockets are removed (the kubelet deregisters the driver) and NVML is shut down.
The claims' CDI specs and the checkpoint stay: running containers are defined by them, and a
restarted driver answers for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deviceplugin.dra.checkpoint import BOOT_ID_FILE, FILE_NAME, Checkpoint, read_boot_id
from deviceplugin.dra.coexistence import conflict_message, live_device_plugins
from deviceplugin.dra.devicehealth import HealthReporter, device_states
from deviceplugin.dra.failpoints import Failpoints
from deviceplugin.dra.kubeapi import KubeApi, connect
from deviceplugin.dra.memorylimits import (
    RECORDS_DIR,
    LimitHook,
    clear_claim,
    install_hook,
    nvml_library,
)
from deviceplugin.dra.migcut import ForeignInstance, MigCutter, blocked
from deviceplugin.dra.mpsclient import DaemonHome
from deviceplugin.dra.mpsdevices import HOMES_DIR, MpsDevices
from deviceplugin.dra.mpstenants import MpsTenancy
from deviceplugin.dra.plugin import DraServer
from deviceplugin.dra.pluginholds import POD_RESOURCES_SOCKET, PluginHolds
from deviceplugin.dra.prepare import NodeDevices, Preparer
from deviceplugin.dra.publisher import SlicePublisher
from deviceplugin.dra.registration import (
    DRA_SOCKET_NAME,
    RegistrationServer,
    plugin_dir,
    registration_socket,
)
from deviceplugin.dra.serverfeatures import ServerProbe, missing
from deviceplugin.dra.slicewatch import SliceWatch
from deviceplugin.model.cdi import CdiOptions
from deviceplugin.model.config import Config
from deviceplugin.model.devices import Inventory
from deviceplugin.model.errors import ConfigError, NvmlError
from deviceplugin.model.gatedfields import DEVICE_TAINTS, UNKNOWN, ServerFeatures
from deviceplugin.model.hostpaths import MPS_CONTROL_SOCKET, socket_path_problem
from deviceplugin.model.log import log_event
from deviceplugin.model.owners import claim_device_holds
from deviceplugin.node.health import HealthChange
from deviceplugin.node.hostscan import scan_host
from deviceplugin.node.mpsdaemon import control_program
from deviceplugin.node.nvml_mig import MigControl
from deviceplugin.ops.drametrics import DraMetrics
from deviceplugin.ops.drastatus import DraStatus, Pool
from deviceplugin.runtime.background import spawn
from deviceplugin.runtime.engine import (
    STOP_GRACE_SECONDS,
    NodeEngine,
)
from deviceplugin.runtime.host import Simulator
from deviceplugin.runtime.options import DraServeOptions

if TYPE_CHECKING:
    from deviceplugin.ops.http import EndpointServer

logger = logging.getLogger(__name__)

BOOT_ID_ENV = "DP_BOOT_ID_FILE"  # where this boot's ID is read; tests point it at a file


class DraDriver:
    """One running DRA driver over the node engine: `start()`, then `stop()` (also after a
    failed start)."""

    def __init__(
        self,
        settings: DraServeOptions,
        metrics: DraMetrics | None = None,
        simulator: Simulator | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or DraMetrics()
        self.engine = NodeEngine(settings, self.metrics, simulator)
        self.node = settings.node_name or socket.gethostname()
        # set by the command line (`--gpu-sharing`), which checked it
        self.memory_shares = settings.gpu_sharing == "memory"
        self.dynamic_mig = settings.mig_mode == "dynamic"  # `--mig-mode`, checked there too
        directory = plugin_dir(settings.kubelet_root, settings.driver_name)
        self.dra_socket = directory / DRA_SOCKET_NAME
        self.registration = RegistrationServer(
            settings.driver_name,
            self.dra_socket,
            registration_socket(settings.kubelet_root, settings.driver_name),
            on_status=self._registration_status,
        )
        self.health = HealthReporter(self.node)
        self.dra: DraServer | None = None
        self.publisher: SlicePublisher | None = None
        self.slice_watch: SliceWatch | None = None
        self._slice_watch_task: asyncio.Task[None] | None = None
        self.server_probe: ServerProbe | None = None  # which gated fields the server keeps
        self._probe_task: asyncio.Task[None] | None = None
        self._features_missing: tuple[tuple[str, str], ...] = ()
        self.preparer: Preparer | None = None
        self.cutter: MigCutter | None = None  # dynamic MIG: cuts partitions at Prepare
        self._foreign: tuple[ForeignInstance, ...] = ()  # MIG instances this driver did not make
        self._api: KubeApi | None = None
        self._plugin_watcher = False  # the kubelet's plugins_registry/ was there at start
        self._started = False
        self._idle = False  # no NVML, failOnInitError false
        self._device_plugins_dir = settings.kubelet_root / "device-plugins"
        self._device_plugins: tuple[str, ...] = ()  # live NVIDIA device-plugin sockets
        # what pods of a device plugin that left hold (a migration with pods running)
        self.plugin_holds = PluginHolds(
            settings.kubelet_root / POD_RESOURCES_SOCKET, self._device_plugins_dir
        )

    @property
    def inventory(self) -> Inventory | None:
        return self.engine.inventory

    @property
    def config(self) -> Config:
        return self.engine.config

    async def start(self) -> None:
        """Raises ConfigError / DiscoveryError / NvmlError, which `program` maps to exit codes."""
        settings, engine = self.settings, self.engine
        failpoints = Failpoints.from_env(settings.env)
        self._plugin_watcher = self.registration.socket.parent.is_dir()
        parsed, text = await engine.open_config()
        engine.adopt_first_config(parsed, text)
        if not engine.open_nvml(
            parsed.config, "failOnInitError is false: publishing nothing, not registering"
        ):
            self._started = self._idle = True
            return
        inventory = await engine.discover_first()
        if self.dynamic_mig and engine.nvml is not None:
            self.cutter = MigCutter(MigControl(engine.nvml), failpoints)
        api = self._api = connect(settings.kubeconfig, settings.env)  # sends nothing yet
        self.publisher = SlicePublisher(
            api,
            self.node,
            settings.driver_name,
            taint=settings.unhealthy_taint,
            observer=self.metrics,
            memory_shares=self.memory_shares,
            dynamic_mig=self.dynamic_mig,
            features=UNKNOWN,
        )
        self.server_probe = ServerProbe(api, self.node, settings.driver_name)
        plugins_dir = self._device_plugins_dir
        self._device_plugins = await asyncio.to_thread(live_device_plugins, plugins_dir)
        self._report_device_plugins()
        await self._read_plugin_holds(inventory, self._device_plugins != ())
        devices = await self._node_devices(parsed.config, inventory)
        self._check_mps_sockets(devices)
        boot_file = Path(settings.env.get(BOOT_ID_ENV) or BOOT_ID_FILE)
        checkpoint = Checkpoint(
            self.dra_socket.parent / FILE_NAME, await asyncio.to_thread(read_boot_id, boot_file)
        )
        self.preparer = Preparer(
            api,
            checkpoint,
            settings.cdi_spec_dir,
            settings.driver_name,
            self.node,
            devices,
            failpoints,
            self._clear_limits,
            self.cutter,
            MpsDevices(
                self.dra_socket.parent / HOMES_DIR,
                self._set_compute_mode,
                MpsTenancy(settings.mps_shared_namespaces),
            ),
            self._held_elsewhere,
        )
        await self.preparer.load()
        await self._scan_foreign()
        await self._report_health()
        self.dra = DraServer(self.preparer, self.dra_socket, self.health, observer=self.metrics)
        await self.dra.start()
        self.registration.endpoint = self.dra.socket  # beside an old instance's in an update
        await self.registration.start()
        engine.start_health(self._health_changed)
        publish_first = not (self.dynamic_mig or self.memory_shares)
        if publish_first:  # taints matter only once a device is unhealthy: left out until known
            self._publish()  # written by the publisher's task: a server that hangs holds nothing
        self._probe_task = spawn(self._learn_server(publish_first), "dra server probe")
        # Once the kubelet can find the driver: its list re-reads what the publish writes.
        self.slice_watch = SliceWatch(api, self.publisher)
        self._slice_watch_task = spawn(self.slice_watch.run(), "dra slice watch")
        self._started = True
        log_event(
            logger,
            "dra.started",
            driver=settings.driver_name,
            node=self.node,
            devices=len(devices.by_name),
            socket=str(self.dra.socket),
        )

    async def stop(self) -> None:
        """Deregister, stop serving (sockets removed), close the client, shut NVML down."""

        async def stop_serving() -> None:
            await self.registration.stop(STOP_GRACE_SECONDS)
            if self.dra is not None:
                await self.dra.stop(STOP_GRACE_SECONDS)
            for task in (self._slice_watch_task, self._probe_task):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self.publisher is not None:
                await self.publisher.close()

        await self.engine.shutdown(stop_serving)
        log_event(logger, "dra.stopped", driver=self.settings.driver_name)

    # --- triggers: each a change on the engine's serialized path ---------------------------------

    async def check_node(self) -> None:
        """The checks every few seconds: our sockets, whether a device plugin serves here, and
        the prepared claims' MPS control daemons (one that died is started again)."""
        await self.heal_sockets()
        await self.check_device_plugins()
        if self.preparer is not None:
            await self.preparer.revive_mps()

    async def heal_sockets(self) -> None:
        """Serve again on a socket deleted or replaced under the running driver (a kubelet
        restart that cleaned its directories, an operator): without the registration socket the
        plugin watcher never registers the driver again, without the DRA socket no claim
        prepares."""
        await self.engine.change(self._heal_sockets, None)

    async def rediscover(self) -> bool:
        """Read the node again; on a change (MIG re-cut, a GPU gone) republish and let Prepare
        map to the new devices. A GPU marked unhealthy that stopped answering stays listed as
        unhealthy, as in `serve`. True when something changed."""
        if not self._serving_devices:
            return False
        await self.check_server()
        return await self.engine.rediscover(self)

    async def check_server(self) -> bool:
        """Probe the API server again when its version changed (an upgrade) or no probe has
        answered yet, and publish what it keeps; one GET otherwise. True when it probed."""
        probe, task = self.server_probe, self._probe_task
        if probe is None or task is None or not task.done():
            return False  # the first probe is still under way
        if not await probe.version_changed():
            return False
        await self._adopt_features(await probe.probe())
        return True

    async def wait_probed(self) -> None:
        """Return once the first probe of the API server has answered or failed."""
        if self._probe_task is not None:
            await asyncio.shield(self._probe_task)

    async def check_device_plugins(self) -> None:
        """Stand aside while a device plugin serves NVIDIA GPUs on this node, and publish again
        once it is gone (dra/coexistence.py), withholding what its pods still hold
        (dra/pluginholds.py). The sockets and the kubelet's List are read off the engine's
        serialized path, so a kubelet that does not answer holds no other change up; a change
        is published on it."""
        inventory = self.engine.inventory
        if self.publisher is None or inventory is None:
            return
        found = await asyncio.to_thread(live_device_plugins, self._device_plugins_dir)
        changed = found != self._device_plugins
        if changed:
            self._device_plugins = found
            self._report_device_plugins()
        if await self._read_plugin_holds(inventory, changed) or changed:
            await self.engine.change(self._republish, None)

    async def reload(
        self, trigger: str, force: bool = False, config_path: str | None = None
    ) -> bool:
        """Read the config file again (from `config_path` when the node's label chose another):
        it changed, or SIGHUP `force`s it. A valid one is adopted once everything it needs is
        computed: claims prepared from now on get its CDI options (driver and dev root), the
        node is rediscovered, and the slices are listed afresh and republished. An invalid one,
        or one whose devices cannot be read, is refused (`config.rejected`, error level, naming
        the field) and the last good config stays in force, whole. True when adopted."""
        if not self._started:
            return False
        if not self._serving_devices:  # idle: only the config file is followed
            return await self.engine.reload(trigger, force, _ConfigOnly(), config_path)
        return await self.engine.reload(trigger, force, self, config_path)

    # --- the changes ------------------------------------------------------------------------------

    async def _health_changed(self, change: HealthChange) -> Mapping[str, Any]:
        """Report one health transition the engine recorded and republish."""
        await self._report_health()
        self._publish()
        return {}

    async def _learn_server(self, after_first_publish: bool) -> None:
        """The first probe: after the first publish is written (so that it costs the start-up
        nothing), or before anything is published when the flags need gated fields."""
        assert self.server_probe is not None and self.publisher is not None
        if after_first_publish:
            await self.publisher.wait_published()
        await self._adopt_features(await self.server_probe.probe())

    async def _adopt_features(self, features: ServerFeatures) -> None:
        """Publish from now on what `features` says the server keeps; a newly missing feature
        is logged once, as an error naming its gate."""

        async def adopt() -> None:
            assert self.publisher is not None
            before = self.publisher.features
            self.publisher.features = features
            now = missing(features, self.dynamic_mig, self.memory_shares)
            for gate, why in now:
                if features.known and (gate, why) not in self._features_missing:
                    log_event(logger, "dra.server.gate_off", logging.ERROR, gate=gate, error=why)
            self._features_missing = now
            newly = not before.known or before.taints
            if features.known and not features.taints and newly:
                log_event(
                    logger,
                    "dra.server.gate_off",
                    logging.WARNING,
                    gate=DEVICE_TAINTS,
                    error=f"the API server ({features.version}) drops device taints",
                    hint="an unhealthy device is left out of the slices until it recovers",
                )
            self._publish()

        await self.engine.change(adopt, None)

    async def _heal_sockets(self) -> None:
        if self.dra is None:  # never started (no NVML with failOnInitError false)
            return
        endpoint = self.dra.socket
        for name, server in (("dra", self.dra), ("registration", self.registration)):
            # A DRA socket served again under another name must be registered again.
            moved = name == "registration" and self.dra.socket != endpoint
            if server.owns_socket and not moved:
                continue
            log_event(
                logger,
                "dra.socket.recreated",
                logging.WARNING,
                server=name,
                socket=str(server.socket),
            )
            await server.stop(0)
            if moved:
                self.registration.endpoint = self.dra.socket
            await server.start()

    async def plan(self, config: Config, inventory: Inventory | None) -> NodeDevices:
        """The devices Prepare maps to under `config` on `inventory`, with the host's files read
        now (Planner): nothing changes until `adopt`."""
        assert inventory is not None  # a driver that serves devices has NVML
        return await self._node_devices(config, inventory)

    async def adopt(self, devices: NodeDevices) -> None:
        """Prepare maps to `devices` from now on; health and slices follow (Planner)."""
        assert self.preparer is not None and self.publisher is not None
        self.preparer.use(devices)
        await self._scan_foreign()
        await self._report_health()
        self._publish()
        self.publisher.request_refresh()

    async def _republish(self) -> None:
        self._publish()

    async def _read_plugin_holds(self, inventory: Inventory, sockets_changed: bool) -> bool:
        """While a device plugin serves, nothing is published and nothing needs reading; once
        it left, what its pods hold is read when the sockets change and every check while
        anything is held or unknown. True when the holdings changed."""
        holds = self.plugin_holds
        if self._device_plugins:
            holds.saw_device_plugin()
            return False
        if not (sockets_changed or holds.needs_reading or not self._started):
            return False
        return await holds.refresh(inventory)

    def endpoints(self, address: str) -> EndpointServer:
        """/healthz, /readyz, /metrics and /status on `address`, from `status()`."""
        from deviceplugin.ops.http import DraEndpoints, EndpointServer  # only a driver with HTTP

        return EndpointServer(address, DraEndpoints(self))

    def status(self) -> DraStatus:
        """The driver's state now, for /readyz, /status and the gauges of /metrics."""
        pool = None
        if self.publisher is not None and (written := self.publisher.written) is not None:
            pool = Pool(self.publisher.generation, *written)
        return DraStatus(
            core=self.engine.core_status(self._started),
            driver=self.settings.driver_name,
            node=self.node,
            idle=self._idle,
            plugin_watcher=self._plugin_watcher,
            registered=self.registration.registered,
            serving=self.dra is not None and self.dra.owns_socket and self.registration.owns_socket,
            pool=pool,
            api_error=self._api.unreachable if self._api is not None else None,
            prepared_claims=len(self.preparer.prepared) if self.preparer is not None else 0,
            checkpoint_unusable=self.preparer.unusable if self.preparer is not None else None,
            device_plugin_conflict=self._conflict(),
            slice_watch_error=self.slice_watch.error if self.slice_watch is not None else None,
            write_refused=self.publisher.refusal if self.publisher is not None else None,
            foreign_mig_instances=tuple(f.describe() for f in self._foreign),
            held_by_device_plugins=tuple(h.describe() for h in self.plugin_holds.holdings.held),
            held_unknown=self.plugin_holds.unknown,
            server_features=self._server_features(),
            features_missing=tuple(why for _, why in self._features_missing),
            kubelet_api=self.dra.calls.document() if self.dra is not None else None,
        )

    def _server_features(self) -> dict[str, Any] | None:
        if self.publisher is None:
            return None
        return self.publisher.features.document()

    # --- internals ------------------------------------------------------------------------------

    @property
    def _serving_devices(self) -> bool:
        return self.preparer is not None and self.publisher is not None

    def _publishable(self, inventory: Inventory) -> Inventory:
        """`inventory`, or no GPU at all while a device plugin owns this node's GPUs."""
        return replace(inventory, gpus=(), links={}) if self._device_plugins else inventory

    def _held_elsewhere(self, device: str) -> str | None:
        """Why a new claim may not have `device` now: a device plugin serves the node (it may
        hand the GPU out at any moment), or a pod a device plugin gave it still holds it. A
        claim allocated before the node changed hands would otherwise give the GPU a second
        owner; claims prepared before keep theirs."""
        if self._device_plugins:
            return f"{self._conflict()}; no new claim is prepared while it serves"
        inventory, holdings = self.engine.inventory, self.plugin_holds.holdings
        if inventory is None or not holdings:
            return None
        for mine in claim_device_holds(inventory, "", "", self.settings.driver_name, device):
            for held in holdings.blocking(mine.gpu, mine.mig):
                return (
                    f"held by pod {held.holder} ({held.source}), which a device plugin gave it "
                    "before this node moved to DRA; it is free again once that pod ends"
                )
        return None

    def _conflict(self) -> str | None:
        if not self._device_plugins:
            return None
        return conflict_message(self._device_plugins, self._device_plugins_dir)

    def _report_device_plugins(self) -> None:
        if self._device_plugins:
            log_event(
                logger,
                "dra.device_plugin.conflict",
                logging.ERROR,
                sockets=list(self._device_plugins),
                error=self._conflict(),
            )
        elif self._started:
            log_event(logger, "dra.device_plugin.gone", hint="publishing this node's devices")

    async def _node_devices(self, config: Config, inventory: Inventory) -> NodeDevices:
        """The published devices with the host facts a claim's CDI spec needs, read now; with
        memory shares, the hook that caps them and the GPUs whose NVML can."""
        options = CdiOptions.from_config(config)
        scan = await asyncio.to_thread(
            scan_host,
            inventory.driver_version,
            options.driver_root,
            options.dev_root,
            self.engine.proc_root,
        )
        if not self.memory_shares:
            return NodeDevices.build(inventory, scan, options, False, self.dynamic_mig)
        library = nvml_library(scan.libraries, options.driver_root)
        hook = await asyncio.to_thread(self._install_hook, library)
        limited = await asyncio.to_thread(self._limited, inventory)
        return NodeDevices.build(inventory, scan, options, True, self.dynamic_mig, hook, limited)

    def _check_mps_sockets(self, devices: NodeDevices) -> None:
        """Where this driver can run MPS daemons, the control socket of the published device with
        the longest name, `<plugin dir>/mps/<device>/pipe/control`, fits a unix socket path: one
        that does not would fail every MPS claim of that device. Raises ConfigError naming
        --kubelet-root."""
        try:
            control_program(devices.options.driver_root)
        except ConfigError:
            return  # no daemon can run here: Prepare refuses MPS claims, naming the driver root
        longest = max(devices.by_name, key=len, default=None)
        if longest is None:
            return
        home = DaemonHome.under(self.dra_socket.parent / HOMES_DIR, longest)
        problem = socket_path_problem(str(Path(home.pipe_dir) / MPS_CONTROL_SOCKET))
        if problem is not None:
            raise ConfigError(
                "--kubelet-root / DP_KUBELET_ROOT",
                f"too long for the MPS control socket of device {longest}: {problem}",
            )

    def _install_hook(self, library: str | None) -> LimitHook | None:
        """The memory-limit hook copied onto the host (a thread); None, logged, when it cannot
        be: shares are then refused at Prepare."""
        from deviceplugin.sim.libbuild import BuildError, hook_program  # only with memory shares

        if library is None:
            why = "no libnvidia-ml under the driver root for the hook to load"
        else:
            try:
                return install_hook(hook_program(), self.dra_socket.parent, library)
            except (BuildError, OSError) as err:
                why = str(err)
        log_event(logger, "dra.limit_hook.unavailable", logging.ERROR, error=why)
        return None

    def _limited(self, inventory: Inventory) -> frozenset[str]:
        """The whole GPUs whose NVML sets per-cgroup memory limits (a thread)."""
        nvml = self.engine.nvml
        found = set()
        for gpu in inventory.gpus:
            try:
                if nvml is not None and nvml.memory_limits_supported(gpu.uuid):
                    found.add(gpu.uuid)
            except NvmlError as err:
                log_event(
                    logger, "dra.limit_check.failed", logging.WARNING, gpu=gpu.uuid, error=str(err)
                )
        return frozenset(found)

    def _clear_limits(self, claim_uid: str) -> str:
        """The share caps of a claim cleared through this driver's NVML (a thread)."""
        nvml = self.engine.nvml
        records = self.dra_socket.parent / RECORDS_DIR
        if nvml is None or not records.is_dir():
            return ""
        return clear_claim(records, claim_uid, nvml.set_memory_limit)

    async def _set_compute_mode(self, uuid: str, mode: int) -> None:
        """For the MPS daemons: a device's compute mode, through this driver's NVML."""
        nvml = self.engine.nvml
        assert nvml is not None  # claims are prepared only by a driver with NVML
        await asyncio.to_thread(nvml.set_compute_mode, uuid, mode)

    async def _report_health(self) -> None:
        """The kubelet's health streams (`devicehealth.py`) get the devices' health now."""
        if self.preparer is not None:
            states = device_states(self.preparer.devices.by_name, self.engine.unhealthy)
            await self.health.update(states)

    def _publish(self) -> None:
        """The slices written again, by the publisher's task, from the inventory and health
        now."""
        inventory = self.engine.inventory
        if self.publisher is not None and inventory is not None:
            taken = blocked(inventory, self._foreign)
            self.publisher.want(
                self._publishable(inventory),
                self.engine.unhealthy,
                taken,
                self.plugin_holds.holdings,
            )

    async def _scan_foreign(self) -> None:
        """Dynamic MIG: find the MIG instances no partition of the checkpoint accounts for (off
        the loop), logged when they change; the partitions they overlap are published
        tainted."""
        inventory = self.engine.inventory
        if self.cutter is None or inventory is None or self.preparer is None:
            return
        recorded = self.preparer.partitions
        found = tuple(await asyncio.to_thread(self.cutter.foreign, inventory, recorded))
        if found != self._foreign and found:
            log_event(
                logger,
                "dra.mig.foreign",
                logging.WARNING,
                instances=[f.describe() for f in found],
                hint="left alone; the partitions they overlap are published tainted",
            )
        self._foreign = found

    def _registration_status(self, registered: bool, error: str) -> None:
        if registered and self.publisher is not None:
            self.publisher.request_refresh()


class _ConfigOnly:
    """The plan of an idle driver (no NVML): the config file alone is followed."""

    async def plan(self, config: Config, inventory: Inventory | None) -> None:
        return None

    async def adopt(self, plan: None) -> None:
        return None
