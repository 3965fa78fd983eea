"""The DRA driver's MPS control daemons: one per device that prepared claims share through MPS,
shared by all of them, run with the device plugin's `node.mpsdaemon.MpsControl` through the
driver root's `nvidia-cuda-mps-control`. The claims of one daemon are of one namespace, or of
namespaces the operator lets share one (`mpstenants.py`): a claim of another namespace is
refused at Prepare (`refusal`) while the daemon serves any.

The first Prepare on a device puts a whole GPU in EXCLUSIVE_PROCESS mode (NVIDIA's driver leaves
a MIG device's mode alone, and so does this one) and starts the daemon in its home,
`<plugin dir>/mps/<device>/`; later claims on the device attach to it. A daemon started anew
starts in a fresh home: whatever a former one left there is removed first, so it never inherits
another's pipe, shm or log. The checkpoint records the daemon with each device prepared with it
(`checkpoint.MpsDaemon`: device UUID, pipe directory, pid), and the daemons on the node are
always those its claims record (`settle`): at the last Unprepare on a device its daemon is asked
to quit, its home removed and the GPU's compute mode set back to DEFAULT; a daemon started for a
claim that then failed goes the same way. At start-up (`adopt`) a recorded daemon that still
answers is reattached; one that does not is cleaned (its stale socket and pid file) and started
again in the same pipe directory, which the claims' containers have mounted; a home no claim
records (a driver that died between starting a daemon and checkpointing it) is stopped and
removed. A daemon recorded for namespaces that may not share one (a checkpoint of a driver run
with other groups) is logged: its claims keep it, and a new claim is refused unless every one of
them may share with it. While the driver runs, its periodic check (`revive`) starts again the
same way a recorded daemon that stopped answering.

Every step runs under the Preparer's locks, so one driver process at a time changes them. The
daemons outlive the driver: running containers use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path

from deviceplugin.dra.checkpoint import MpsDaemon, PreparedClaim
from deviceplugin.dra.mpsclient import DaemonHome
from deviceplugin.dra.mpstenants import MpsTenancy
from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.hostpaths import MPS_CONTROL_SOCKET
from deviceplugin.model.log import log_event
from deviceplugin.model.mps import DaemonSpec
from deviceplugin.node.mpsdaemon import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODE_EXCLUSIVE_PROCESS,
    MpsControl,
    MpsError,
    control_program,
)
from deviceplugin.node.mpsshm import release_shm

logger = logging.getLogger(__name__)

HOMES_DIR = "mps"  # under the plugin directory
PID_FILE = "nvidia-cuda-mps-control.pid"  # in the pipe directory, as NVIDIA's daemon keeps it

SetComputeMode = Callable[[str, int], Awaitable[None]]


class MpsDevices:
    """The daemons under `root` (`<plugin dir>/mps`)."""

    def __init__(
        self, root: Path, set_compute_mode: SetComputeMode, tenancy: MpsTenancy | None = None
    ) -> None:
        self.root = root
        self._set_compute_mode = set_compute_mode
        self.tenancy = tenancy or MpsTenancy()

    def home(self, device: str) -> DaemonHome:
        return DaemonHome.under(self.root, device)

    def refusal(
        self, device: str, namespace: str, claims: Mapping[str, PreparedClaim]
    ) -> str | None:
        """Why a claim of `namespace` may not use `device`'s daemon, given the `claims` that
        use it; None when it may."""
        return self.tenancy.refusal(device, namespace, serving(claims).get(device, ()))

    async def attach(
        self,
        claims: Mapping[str, PreparedClaim],
        held: Mapping[str, PreparedClaim],
        driver_root: str,
    ) -> tuple[dict[str, PreparedClaim], dict[str, str]]:
        """`claims` with each MPS device's daemon running and recorded: the one `held` claims
        record, else one started now; and, left out of them, the claims whose daemon could not
        be started, with why."""
        running = recorded(held)
        ready: dict[str, PreparedClaim] = {}
        failed: dict[str, str] = {}
        for uid, claim in claims.items():
            devices = []
            try:
                for device in claim.devices:
                    if device.mps is not None:
                        daemon = running.get(device.device)
                        if daemon is None:
                            daemon = await self._start(
                                device.device, device.mps, driver_root, fresh=True
                            )
                            running[device.device] = daemon
                        device = replace(device, mps=daemon)
                    devices.append(device)
            except (MpsError, ConfigError) as err:
                failed[uid] = f"ResourceClaim {claim.namespace}/{claim.name}: {err}"
                continue
            ready[uid] = replace(claim, devices=tuple(devices))
        return ready, failed

    async def settle(
        self, claims: Mapping[str, PreparedClaim], driver_root: str, uuids: Mapping[str, str]
    ) -> None:
        """Stop every daemon under the root that `claims` do not record: asked to quit, its
        home removed, its GPU (`uuids`: device name -> UUID) back in compute mode DEFAULT."""
        wanted = recorded(claims)
        homes = await asyncio.to_thread(_homes, self.root)
        for device in homes:
            if device not in wanted:
                await self._stop(device, uuids.get(device, ""), driver_root)

    async def adopt(
        self, claims: Mapping[str, PreparedClaim], driver_root: str, uuids: Mapping[str, str]
    ) -> dict[str, PreparedClaim]:
        """At start-up: the daemons `claims` record reattached, or started again when dead, and
        the others stopped (`settle`). The claims with their daemons' pids now."""
        now: dict[str, MpsDaemon] = {}
        for device, daemon in recorded(claims).items():
            now[device] = await self._reattach(device, daemon, driver_root)
        for device, namespaces in serving(claims).items():
            if mixed := self.tenancy.mixed(namespaces):
                log_event(
                    logger,
                    "dra.mps.tenants_mixed",
                    logging.ERROR,
                    device=device,
                    namespaces=",".join(mixed),
                    detail="their claims keep the daemon; claims of other namespaces are refused",
                )
        await self.settle(claims, driver_root, uuids)
        return _with_daemons(claims, now)

    async def revive(
        self, claims: Mapping[str, PreparedClaim], driver_root: str
    ) -> dict[str, PreparedClaim]:
        """While the driver runs: each daemon `claims` record that no longer answers started
        again in its pipe directory (`_restart`); those that answer are left alone. The claims
        with their daemons' pids now."""
        try:
            control = MpsControl(control_program(driver_root))
        except ConfigError:
            return dict(claims)  # nothing of ours can run a daemon: `adopt` logged why
        now: dict[str, MpsDaemon] = {}
        for device, daemon in recorded(claims).items():
            if not await control.healthy(self._spec(device, daemon.uuid)):
                now[device] = await self._restart(device, daemon, driver_root)
        return _with_daemons(claims, now) if now else dict(claims)

    # --- internals ------------------------------------------------------------------------------

    def _spec(self, device: str, uuid: str) -> DaemonSpec:
        home = self.home(device)
        return DaemonSpec(device, home.pipe_dir, home.log_dir, home.shm_dir, (uuid,), 100, ())

    async def _start(
        self, device: str, daemon: MpsDaemon, driver_root: str, fresh: bool = False
    ) -> MpsDaemon:
        """Start `device`'s daemon; `fresh`: in a new home, anything left in one removed (the
        daemon a restart starts again keeps the directories its clients have mounted). Raises
        MpsError, ConfigError (no control program)."""
        control = MpsControl(control_program(driver_root), "--kubelet-root")
        spec = self._spec(device, daemon.uuid)
        if _whole_gpu(daemon.uuid):
            try:
                await self._set_compute_mode(daemon.uuid, COMPUTE_MODE_EXCLUSIVE_PROCESS)
            except DevicePluginError as err:
                raise MpsError(
                    f"{device}: MPS needs compute mode EXCLUSIVE_PROCESS: {err}"
                ) from None
        await control.quit(spec)  # one a crashed driver left without a record
        if fresh:
            await asyncio.to_thread(self._remove_home, device)
            if (self.root / device).exists():
                raise MpsError(
                    f"{device}: {self.root / device}, a former MPS daemon's home, cannot be"
                    " removed, and a new daemon would inherit what it holds"
                )
        await control.start(spec)
        pid = await asyncio.to_thread(_pid, spec.pipe_dir)
        log_event(logger, "dra.mps.daemon_started", device=device, pipe=spec.pipe_dir, pid=pid)
        return MpsDaemon(daemon.uuid, spec.pipe_dir, pid)

    async def _reattach(self, device: str, daemon: MpsDaemon, driver_root: str) -> MpsDaemon:
        spec = self._spec(device, daemon.uuid)
        try:
            control = MpsControl(control_program(driver_root))
        except ConfigError as err:
            log_event(logger, "dra.mps.daemon_lost", logging.ERROR, device=device, error=str(err))
            return daemon
        if await control.healthy(spec):
            pid = await asyncio.to_thread(_pid, spec.pipe_dir)
            log_event(logger, "dra.mps.daemon_reattached", device=device, pid=pid)
            return replace(daemon, pid=pid)
        return await self._restart(device, daemon, driver_root)

    async def _restart(self, device: str, daemon: MpsDaemon, driver_root: str) -> MpsDaemon:
        """A daemon that does not answer cleaned (its stale socket and pid file) and started
        again in its pipe directory, which the claims' containers have mounted; pid 0 when it
        cannot be."""
        spec = self._spec(device, daemon.uuid)
        log_event(logger, "dra.mps.daemon_dead", logging.WARNING, device=device, pid=daemon.pid)
        await asyncio.to_thread(_clean, spec.pipe_dir)
        try:
            return await self._start(device, daemon, driver_root)
        except (MpsError, ConfigError) as err:
            log_event(logger, "dra.mps.daemon_lost", logging.ERROR, device=device, error=str(err))
            return replace(daemon, pid=0)

    async def _stop(self, device: str, uuid: str, driver_root: str) -> None:
        spec = self._spec(device, uuid)
        with contextlib.suppress(ConfigError):  # without the program, nothing of ours runs it
            await MpsControl(control_program(driver_root)).quit(spec)
        if _whole_gpu(uuid):
            try:
                await self._set_compute_mode(uuid, COMPUTE_MODE_DEFAULT)
            except DevicePluginError as err:
                log_event(
                    logger,
                    "dra.mps.compute_mode_failed",
                    logging.WARNING,
                    device=device,
                    error=str(err),
                )
        await asyncio.to_thread(self._remove_home, device)
        log_event(logger, "dra.mps.daemon_stopped", device=device)

    def _remove_home(self, device: str) -> None:
        """`device`'s home removed, its shm tmpfs unmounted first."""
        release_shm(self.home(device).shm_dir)
        shutil.rmtree(self.root / device, True)


def recorded(claims: Mapping[str, PreparedClaim]) -> dict[str, MpsDaemon]:
    """Device name -> the daemon the claims record for it."""
    return {d.device: d.mps for c in claims.values() for d in c.devices if d.mps is not None}


def serving(claims: Mapping[str, PreparedClaim]) -> dict[str, set[str]]:
    """Device name -> the namespaces of the claims that use its daemon."""
    found: dict[str, set[str]] = {}
    for claim in claims.values():
        for device in claim.devices:
            if device.mps is not None:
                found.setdefault(device.device, set()).add(claim.namespace)
    return found


def _with_daemons(
    claims: Mapping[str, PreparedClaim], daemons: Mapping[str, MpsDaemon]
) -> dict[str, PreparedClaim]:
    """`claims` with each MPS device's daemon replaced by the one `daemons` has for it."""
    return {
        uid: replace(
            claim,
            devices=tuple(
                replace(d, mps=daemons.get(d.device, d.mps)) if d.mps is not None else d
                for d in claim.devices
            ),
        )
        for uid, claim in claims.items()
    }


def _whole_gpu(uuid: str) -> bool:
    return uuid.startswith("GPU-")


def _homes(root: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in root.iterdir() if entry.is_dir())
    except FileNotFoundError:
        return []


def _pid(pipe_dir: str) -> int:
    """The daemon's pid from its pid file; 0 when it keeps none."""
    try:
        return int((Path(pipe_dir) / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return 0


def _clean(pipe_dir: str) -> None:
    """A dead daemon's socket and pid file removed; the directory stays (containers mount it)."""
    for name in (MPS_CONTROL_SOCKET, PID_FILE):
        with contextlib.suppress(FileNotFoundError):
            (Path(pipe_dir) / name).unlink()
