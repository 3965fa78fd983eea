"""NodePrepareResources and NodeUnprepareResources: allocated claims made into CDI devices.

Prepare reads each ResourceClaim from the API server (the kubelet sends only namespace, name
and UID), takes the allocation results of this driver, maps each device name to the GPU or MIG
device behind it (the names `model/slices.py` publishes), writes one CDI spec per claim and
checkpoints the answer. CDI names, for driver `gpu.nvidia.com`:

- kind `k8s.gpu.nvidia.com/claim`, so they never collide with the device plugin's
  `k8s.device-plugin.nvidia.com/gpu` spec on the same node;
- one device `<claim-uid>-<device>` per allocated device (`<uid>-gpu-0`, `<uid>-gpu-0-mig-7-0`;
  `<uid>-<device>-<share-id>` for one share of a shared device) carrying its device nodes and
  the environment of its settings (`opaque.py`: time-slicing from the opaque config, admin
  access, the share ID; with MPS, the pipe and shm of the device's daemon, `mpsdevices.py`,
  and the claim's limits, `mpsclient.py`), and the driver's common edits at spec level
  (applied once when any device of the claim is injected);
- file `k8s.gpu.nvidia.com-claim_<uid>.json` in the CDI directory (the transient-spec name CDI
  libraries use), so Unprepare finds it from the UID alone, even without a checkpoint entry.

A claim that cannot be prepared (not found, not allocated, re-created with another UID, a
device this node does not publish or already prepared for another claim, a spec that cannot be
written) gets an error string in its own entry, and a reason for the metrics; the other claims
of the call are prepared anyway. A claim reference whose UID is not a UID, or whose namespace or
name Kubernetes would not allow, is refused before anything is read or written: the UID names
the claim's spec file. A claim already prepared is answered from the checkpoint, without asking
the API server. Unprepare removes the spec and the checkpoint entry; an unknown claim is already
unprepared.

Crash safety. Each change holds the node's lock (`nodelock.py`: one driver process at a time)
and starts from the checkpoint as it is on disk. A claim is checkpointed `PrepareStarted`
before its spec is written and `PrepareCompleted` after, so a driver that died in between finds
it at start-up and rolls it back (spec removed, entry dropped); the kubelet's retry prepares it
anew. Unprepare removes the spec before the entry, so a retry after a crash finds the entry and
finishes. A checkpoint of an earlier boot is dropped at start-up: nothing prepared survives a
reboot. Files are written, fsynced and removed off the event loop. `failpoints.py` can stop the
process between these steps, to prove it.

Dynamic MIG partitions (`migcut.py`) are cut between the `PrepareStarted` checkpoint, which
records the intended partition, and the spec: once cut, the claim is checkpointed again with
what was made, and the partition's CDI device gets the edits of a MIG device. Unprepare destroys
them after the spec, before the entry; start-up destroys those of a claim cut short.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from deviceplugin.dra.admission import RESULTS_PATH, Asked, admin_requests, refusal
from deviceplugin.dra.checkpoint import (
    COMPLETED,
    STARTED,
    VERSION,
    Checkpoint,
    CheckpointError,
    MpsDaemon,
    PreparedClaim,
    PreparedDevice,
    Saved,
)
from deviceplugin.dra.failpoints import (
    PREPARE_AFTER_CDI_SPEC,
    PREPARE_AFTER_CHECKPOINT,
    UNPREPARE_AFTER_CDI_SPEC_REMOVED,
    Failpoints,
)
from deviceplugin.dra.memorylimits import LimitHook
from deviceplugin.dra.migcut import CutError, MigCutter, cut_device
from deviceplugin.dra.migrecord import MigPartition
from deviceplugin.dra.mpsclient import MIB, client_edits, second_mps_device
from deviceplugin.dra.mpsdevices import MpsDevices, recorded
from deviceplugin.dra.nodelock import LockTimeout, NodeLock
from deviceplugin.dra.opaque import (
    CONFIG_PATH,
    EXCLUSIVE,
    ConfigEntry,
    DeviceSettings,
    device_env,
    read_entries,
    settings_for,
)
from deviceplugin.dra.opaquetypes import OpaqueConfigError
from deviceplugin.dra.shares import (
    BESIDE_PARTITIONS,
    MIG_FIXED,
    NO_MEMORY_SHARES,
    ShareError,
    refuse_time_slicing,
    share_limit,
)
from deviceplugin.model.cdi import (
    CdiError,
    CdiOptions,
    HostScan,
    common_edits,
    device_edits,
    minimum_cdi_version,
)
from deviceplugin.model.devices import Gpu, Inventory, MigDevice, MigProfile
from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.kubenames import dns_label_problem, dns_subdomain_problem, uid_problem
from deviceplugin.model.log import log_event, log_exception
from deviceplugin.model.memoryshares import MEMORY, MEMORY_LIMIT_ENV
from deviceplugin.model.migpartitions import partition_name, partitionable, partitions
from deviceplugin.model.record import record
from deviceplugin.model.slices import device_name, physical_devices
from deviceplugin.node.cdiwriter import SpecWriter, describe
from deviceplugin.node.mpsdaemon import CONTROL_PROGRAM, control_program
from deviceplugin.ops.drastatus import CheckpointUnusable
from deviceplugin.runtime.kubeclient import KubeError

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
CONFIG_SECONDS = 5.0  # to read a claim's opaque config; `opaquebounds` keeps it far within
CDI_CLASS = "claim"
LOCK_FILE_NAME = "checkpoint.lock"

# Why a claim could not be prepared: the `reason` label of the failure metric (and admission's:
# `admission.py`; migcut's: `migcut.py`).
INVALID_REFERENCE = "invalid-reference"  # the kubelet's namespace, name or UID
NOT_FOUND = "not-found"
API_ERROR = "api-error"
RECREATED = "recreated"  # another UID than the kubelet's
NOT_ALLOCATED = "not-allocated"
INVALID_CONFIG = "invalid-config"  # opaque config, a share ID, admin access, a malformed claim
UNKNOWN_DEVICE = "unknown-device"
HOST_FILES = "host-files"  # the device's CDI edits cannot be built
CDI_SPEC = "cdi-spec"  # the spec cannot be written
CHECKPOINT = "checkpoint"  # the checkpoint cannot be saved
LOCKED = "locked"  # another driver process holds the node's lock
NO_CUTTER = "no-mig-cutter"  # a dynamic MIG partition, on a driver that cannot cut one
MPS_DAEMON = "mps-daemon"  # the device's MPS control daemon cannot be started
MPS_TENANT = "mps-tenant"  # the device's MPS daemon serves a namespace this one may not join
HELD_ELSEWHERE = "held-elsewhere"  # a device plugin serves the node, or its pod holds the device


class ClaimReader(Protocol):
    """Reads a ResourceClaim (`kubeapi.KubeApi`); raises KubeError."""

    async def read_claim(self, namespace: str, name: str) -> JsonObject: ...


@record(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def claim_problem(index: int, ref: ClaimRef) -> str | None:
    """Why the kubelet's `claims[index]` cannot be used, naming the field; None when it can."""
    for field, problem in (
        ("uid", uid_problem(ref.uid)),
        ("namespace", dns_label_problem(ref.namespace)),
        ("name", dns_subdomain_problem(ref.name)),
    ):
        if problem is not None:
            return f"claims[{index}].{field}: {problem}"
    return None


@record(frozen=True)
class Outcome:
    """One claim's answer: its devices, or why it could not be prepared (`error` for the
    kubelet, `reason` for the metrics)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    reason: str = ""


class PrepareError(DevicePluginError):
    """This claim cannot be prepared; the message goes to the kubelet as the claim's error."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


Read = tuple[JsonObject, list[ConfigEntry] | PrepareError]  # a claim, and its config entries


@record(frozen=True)
class NodeDevices:
    """What allocation results are mapped to: each published device name with the GPU (and MIG
    device) behind it, the host's files and the CDI options."""

    by_name: Mapping[str, tuple[Gpu, MigDevice | None]]
    scan: HostScan
    options: CdiOptions
    memory_shares: bool = False  # whole GPUs are published shareable by memory
    limit_hook: LimitHook | None = None  # what caps a share (memorylimits.py)
    limited: frozenset[str] = frozenset()  # GPU UUIDs whose NVML has per-cgroup memory limits
    # dynamic MIG: each partition's name -> its GPU, profile and placement (start, size)
    partitions: Mapping[str, tuple[Gpu, MigProfile, int, int]] = dataclasses.field(
        default_factory=dict
    )

    @property
    def cdi(self) -> tuple[HostScan, CdiOptions]:
        return self.scan, self.options

    def not_shareable(self, name: str) -> str:
        """Why device `name` takes no memory share, as the slices publish it
        (`slices._shareable`: a whole GPU, with memory shares, not beside dynamic partitions);
        "" when it takes one."""
        found = self.by_name.get(name)
        if found is None or found[1] is not None:
            return MIG_FIXED  # a MIG device, or a dynamic partition
        if not self.memory_shares:
            return NO_MEMORY_SHARES
        if any(gpu.uuid == found[0].uuid for gpu, *_ in self.partitions.values()):
            return BESIDE_PARTITIONS
        return ""

    @classmethod
    def build(
        cls,
        inventory: Inventory,
        scan: HostScan,
        options: CdiOptions,
        memory_shares: bool = False,
        dynamic_mig: bool = False,
        limit_hook: LimitHook | None = None,
        limited: frozenset[str] = frozenset(),
    ) -> NodeDevices:
        """Only devices the slices publish: a MIG-enabled GPU is published as its MIG devices,
        not whole, so its own name is unknown here too; in dynamic MIG mode a partitionable
        GPU is published whole and as its partitions instead."""
        found = physical_devices(inventory, dynamic_mig)
        by_name = {device_name(gpu, mig): (gpu, mig) for gpu, mig in found}
        cut = {
            partition_name(gpu, profile, start): (gpu, profile, start, size)
            for gpu in inventory.gpus
            if dynamic_mig and partitionable(gpu)
            for profile, start, size in partitions(gpu)
        }
        return cls(by_name, scan, options, memory_shares, limit_hook, limited, cut)


def _refused(claims: Sequence[ClaimRef]) -> dict[str, str]:
    """The claims whose reference cannot be used, by UID, with why (logged)."""
    refused = {}
    for index, ref in enumerate(claims):
        why = claim_problem(index, ref)
        if why is not None:
            log_event(logger, "dra.claim.refused", logging.WARNING, error=why)
            refused[ref.uid] = why
    return refused


def cdi_kind(driver: str) -> str:
    """`k8s.<driver>/claim`."""
    return f"k8s.{driver}/{CDI_CLASS}"


def spec_file_name(driver: str, uid: str) -> str:
    """`k8s.<driver>-claim_<uid>.json`."""
    return f"k8s.{driver}-{CDI_CLASS}_{uid}.json"


def cdi_device_name(uid: str, device: str, share: str = "") -> str:
    """`<uid>-<device>`, and `-<share ID>` for one share of a shared device."""
    return f"{uid}-{device}-{share}" if share else f"{uid}-{device}"


class Preparer:
    """Prepares and unprepares claims for one driver and pool (the node). Changes are serialised
    in this process and, by the node's lock, with any other driver process on the node."""

    def __init__(
        self,
        reader: ClaimReader,
        checkpoint: Checkpoint,
        cdi_dir: Path,
        driver: str,
        pool: str,
        devices: NodeDevices,
        failpoints: Failpoints | None = None,
        clear_limits: Callable[[str], str] | None = None,
        cutter: MigCutter | None = None,
        mps: MpsDevices | None = None,
        held_elsewhere: Callable[[str], str | None] | None = None,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.cdi_dir = cdi_dir
        self._reader = reader
        self._checkpoint = checkpoint
        self._devices = devices
        self._failpoints = failpoints or Failpoints()
        self._clear_limits = clear_limits  # a claim's share caps cleared; why not, or ""
        self._cutter = cutter  # dynamic MIG: cuts and removes partitions
        self._mps = mps  # the devices' MPS control daemons
        self._held_elsewhere = held_elsewhere  # why a device plugin has a device now, or None
        self._claims: dict[str, PreparedClaim] = {}
        self.unusable: CheckpointUnusable | None = None  # checkpoints set aside since start
        self._lock = asyncio.Lock()
        self._node_lock = NodeLock(checkpoint.path.with_name(LOCK_FILE_NAME))

    async def load(self) -> None:
        """Adopt the checkpoint, under the node's lock. Claims whose Prepare was cut short are
        rolled back, and all of an earlier boot's are dropped, specs removed. One that cannot
        be trusted is logged and set aside: claims it held are prepared again from the API
        server when the kubelet asks, and their specs are found by UID when it unprepares.
        Raises LockTimeout."""
        async with self._serialized():
            saved = await self._saved()
            if saved is None:
                return
            dropped = self._stale(saved)
            now = self._checkpoint.boot_id
            rebooted = bool(saved.boot_id and now and saved.boot_id != now)
            self._claims = {u: c for u, c in saved.claims.items() if u not in dropped}
            for uid in dropped:
                # MIG instances do not survive a reboot: any there now are someone else's
                why = "" if rebooted else await self._release(saved.claims[uid])
                if why:
                    self._claims[uid] = replace(saved.claims[uid], state=STARTED)
                    log_event(logger, "dra.mig.orphaned", logging.ERROR, uid=uid, error=why)
                    continue
                try:
                    await asyncio.to_thread(SpecWriter(self.spec_path(uid)).remove)
                except OSError as err:
                    # kept as cut short: rolled back at the next start
                    self._claims[uid] = replace(saved.claims[uid], state=STARTED)
                    log_event(
                        logger,
                        "dra.spec.orphaned",
                        logging.WARNING,
                        path=str(self.spec_path(uid)),
                        error=describe(err),
                    )
            adopted = self._claims
            if self._mps is not None:
                adopted = await self._mps.adopt(self._claims, *self._mps_node())
            changed = adopted != self._claims
            self._claims = adopted
            if (
                changed
                or dropped
                or saved.version != VERSION
                or saved.boot_id != self._checkpoint.boot_id
            ):
                await self._save_or_log(self._claims)
        log_event(logger, "dra.checkpoint.loaded", claims=len(self._claims), boot_id=saved.boot_id)

    async def revive_mps(self) -> None:
        """Start again each MPS control daemon the prepared claims record that stopped
        answering (`MpsDevices.revive`), the new pids checkpointed. Skipped, to be tried at the
        next check, while the node's lock is held elsewhere."""
        if self._mps is None or not recorded(self._claims):
            return
        try:
            async with self._serialized():
                self._claims = await self._current()
                revived = await self._mps.revive(self._claims, self._mps_node()[0])
                if revived != self._claims:
                    self._claims = revived
                    await self._save_or_log(revived)
        except (LockTimeout, OSError) as err:
            log_event(logger, "dra.mps.check_skipped", error=self._not_locked(err))

    def use(self, devices: NodeDevices) -> None:
        """Map later allocation results to these devices (after a rediscovery); claims already
        prepared keep the answer they were given."""
        self._devices = devices

    @property
    def devices(self) -> NodeDevices:
        """What allocation results are mapped to now."""
        return self._devices

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        """The claims prepared to completion."""
        return {uid: claim for uid, claim in self._claims.items() if claim.completed}

    @property
    def partitions(self) -> list[MigPartition]:
        """Every dynamic MIG partition the checkpoint records, prepared or being prepared."""
        return [p for claim in self._claims.values() for p in claim.partitions]

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / spec_file_name(self.driver, uid)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """One outcome per claim UID. Claims not yet prepared are read from the API server, and
        their opaque config parsed (`_configured`), concurrently, before the lock is taken."""
        outcomes = {
            uid: Outcome(error=why, reason=INVALID_REFERENCE)
            for uid, why in _refused(claims).items()
        }
        todo = [r for r in claims if r.uid not in outcomes and self._done(r.uid) is None]
        read = dict(zip(todo, await asyncio.gather(*(self._read(r) for r in todo)), strict=True))
        try:
            async with self._serialized():
                self._claims = await self._current()
                fresh: dict[str, tuple[PreparedClaim, JsonObject | None]] = {}
                for ref in claims:
                    if ref.uid in outcomes:
                        continue
                    if (known := self._done(ref.uid)) is not None:
                        outcomes[ref.uid] = Outcome(known.devices)
                        continue
                    found = read[ref] if ref in read else await self._read(ref)
                    try:
                        if isinstance(found, PrepareError):
                            raise found
                        others = {**self.prepared, **{u: c for u, (c, _) in fresh.items()}}
                        fresh[ref.uid] = self._plan(ref, found, others)
                    except PrepareError as err:
                        _log_failed(ref, ref.uid, str(err))
                        outcomes[ref.uid] = Outcome(error=str(err), reason=err.reason)
                    except Exception as err:  # planning writes nothing: the claim fails alone
                        log_exception(logger, "dra.claim.unreadable", claim=str(ref), uid=ref.uid)
                        why = f"ResourceClaim {ref} cannot be read: {type(err).__name__}: {err}"
                        outcomes[ref.uid] = Outcome(error=why, reason=INVALID_CONFIG)
                if fresh and self._mps is not None:
                    fresh = await self._attach(fresh, outcomes)
                if fresh:
                    outcomes.update(await self._commit(fresh))
                if self._mps is not None:  # a daemon started for a claim that failed
                    await self._mps.settle(self._claims, *self._mps_node())
        except (LockTimeout, OSError) as err:
            why = self._not_locked(err)
            for ref in claims:
                outcomes.setdefault(ref.uid, Outcome(error=why, reason=LOCKED))
        return {ref.uid: outcomes[ref.uid] for ref in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """An error string per claim UID, empty when it is unprepared (or never was). The spec
        goes first, the checkpoint entry after: a crash in between leaves an entry whose
        Unprepare the kubelet retries."""
        errors = _refused(claims)
        try:
            async with self._serialized():
                self._claims = await self._current()
                removed: dict[str, PreparedClaim] = {}
                for ref in claims:
                    if ref.uid in errors:
                        continue
                    path = self.spec_path(ref.uid)
                    if self._clear_limits is not None:  # the containers have stopped
                        why = await asyncio.to_thread(self._clear_limits, ref.uid)
                        if why:
                            errors[ref.uid] = why
                            continue
                    try:
                        await asyncio.to_thread(SpecWriter(path).remove)
                    except OSError as err:
                        errors[ref.uid] = f"removing CDI spec {path}: {describe(err)}"
                        continue
                    known = self._claims.get(ref.uid)
                    if known is not None and (why := await self._release(known)):
                        errors[ref.uid] = why  # the entry stays: the kubelet's retry finishes
                        continue
                    errors[ref.uid] = ""
                    if (known := self._claims.get(ref.uid)) is not None:
                        removed[ref.uid] = known
                if removed:
                    self._failpoints.reach(UNPREPARE_AFTER_CDI_SPEC_REMOVED)
                    remaining = {u: c for u, c in self._claims.items() if u not in removed}
                    if self._mps is not None:  # a crash next finds the entry and retries
                        await self._mps.settle(remaining, *self._mps_node())
                    try:
                        await asyncio.to_thread(self._checkpoint.save, remaining)
                        self._claims = remaining
                    except OSError as err:
                        for uid in removed:  # a retry saves again
                            errors[uid] = self._save_failed(err)
        except (LockTimeout, OSError) as err:
            why = self._not_locked(err)
            for ref in claims:
                errors.setdefault(ref.uid, why)
            return {ref.uid: errors[ref.uid] for ref in claims}
        for uid, claim in removed.items():
            if not errors[uid]:
                log_event(logger, "dra.claim.unprepared", claim=f"{claim.namespace}/{claim.name}")
        return {ref.uid: errors[ref.uid] for ref in claims}

    # --- internals ------------------------------------------------------------------------------

    def _serialized(self) -> contextlib.AbstractAsyncContextManager[None]:
        """This process's lock, then the node's."""
        return _both(self._lock, self._node_lock)

    def _mps_node(self) -> tuple[str, dict[str, str]]:
        """The driver root (its control program) and each device name's UUID, for the daemons."""
        uuids = {name: (mig or gpu).uuid for name, (gpu, mig) in self._devices.by_name.items()}
        return self._devices.options.driver_root, uuids

    async def _attach(
        self,
        fresh: dict[str, tuple[PreparedClaim, JsonObject | None]],
        outcomes: dict[str, Outcome],
    ) -> dict[str, tuple[PreparedClaim, JsonObject | None]]:
        """The planned claims with their MPS devices' daemons running; those whose daemon could
        not be started get their outcome."""
        assert self._mps is not None
        planned = {uid: claim for uid, (claim, _) in fresh.items()}
        ready, failed = await self._mps.attach(planned, self._claims, self._mps_node()[0])
        for uid, why in failed.items():
            _log_failed(planned[uid], uid, why)
            outcomes[uid] = Outcome(error=why, reason=MPS_DAEMON)
        return {uid: (claim, fresh[uid][1]) for uid, claim in ready.items()}

    def _not_locked(self, err: LockTimeout | OSError) -> str:
        """Why the node's lock was not taken: held too long elsewhere, or its file unusable."""
        if isinstance(err, OSError):
            return f"opening {self._node_lock.path}: {describe(err)}"
        return str(err)

    async def _saved(self) -> Saved | None:
        """The checkpoint as on disk; None when it cannot be trusted: then it is logged and set
        aside, so the next save replaces nothing (a newer driver's claims stay for an
        operator)."""
        try:
            return await asyncio.to_thread(self._checkpoint.load)
        except CheckpointError as err:
            error = str(err)
        try:
            moved, why = str(await asyncio.to_thread(self._checkpoint.set_aside)), ""
        except OSError as err:  # saves fail until it can be: nothing is lost
            moved, why = "", describe(err)
        log_event(
            logger,
            "dra.checkpoint.unusable",
            logging.ERROR,
            error=error,
            set_aside=moved,
            **({"set_aside_error": why} if why else {}),
        )
        count = self.unusable.count + 1 if self.unusable is not None else 1
        self.unusable = CheckpointUnusable(count, error, moved)
        return None

    async def _current(self) -> dict[str, PreparedClaim]:
        """The claims as the checkpoint holds them now (another driver process on the node may
        have changed them); what this process knew when the file cannot be trusted."""
        saved = await self._saved()
        return dict(saved.claims) if saved is not None else self._claims

    def _stale(self, saved: Saved) -> list[str]:
        """The saved claims to roll back at start-up, each logged: all of them when an earlier
        boot wrote the file, else those whose Prepare was cut short."""
        now = self._checkpoint.boot_id
        if saved.boot_id and now and saved.boot_id != now:
            log_event(
                logger,
                "dra.checkpoint.earlier_boot",
                logging.WARNING,
                saved_boot_id=saved.boot_id,
                boot_id=now,
                dropped=len(saved.claims),
            )
            return list(saved.claims)
        stale = [uid for uid, claim in saved.claims.items() if claim.state == STARTED]
        for uid in stale:
            claim = saved.claims[uid]
            log_event(
                logger,
                "dra.claim.rolled_back",
                logging.WARNING,
                claim=f"{claim.namespace}/{claim.name}",
                uid=uid,
            )
        return stale

    async def _save_or_log(self, claims: Mapping[str, PreparedClaim]) -> None:
        try:
            await asyncio.to_thread(self._checkpoint.save, claims)
        except OSError as err:
            log_event(logger, "dra.checkpoint.failed", logging.ERROR, error=self._save_failed(err))

    def _save_failed(self, err: OSError) -> str:
        return f"saving checkpoint {self._checkpoint.path}: {describe(err)}"

    def _done(self, uid: str) -> PreparedClaim | None:
        """The claim prepared to completion, while its spec is still on disk (a claim with no
        devices of ours has none)."""
        known = self._claims.get(uid)
        if known is None or not known.completed:
            return None
        if known.devices and not self.spec_path(uid).exists():
            return None
        return known

    async def _read(self, ref: ClaimRef) -> Read | PrepareError:
        try:
            claim = await self._reader.read_claim(ref.namespace, ref.name)
        except KubeError as err:
            if err.status == 404:
                return PrepareError(f"ResourceClaim {ref} not found", NOT_FOUND)
            return PrepareError(f"reading ResourceClaim {ref}: {err}", API_ERROR)
        return claim, await self._configured(ref, claim)

    async def _configured(
        self, ref: ClaimRef, claim: JsonObject
    ) -> list[ConfigEntry] | PrepareError:
        """The claim's config entries of this driver, read in a worker thread within
        CONFIG_SECONDS: a claim written to be expensive holds up neither the event loop nor
        the other claims (a thread past its deadline is left to end; its answer is dropped)."""
        try:
            allocated = _allocated(ref, claim) or {}
        except PrepareError as err:
            return err
        read = asyncio.to_thread(read_entries, allocated, self.driver)
        try:
            return await asyncio.wait_for(read, CONFIG_SECONDS)
        except OpaqueConfigError as err:
            return PrepareError(f"ResourceClaim {ref}: {err}", INVALID_CONFIG)
        except TimeoutError:
            why = f"{CONFIG_PATH}: not read within {CONFIG_SECONDS:g} s"
            return PrepareError(f"ResourceClaim {ref}: {why}", INVALID_CONFIG)

    def _plan(
        self, ref: ClaimRef, read: Read, others: Mapping[str, PreparedClaim]
    ) -> tuple[PreparedClaim, JsonObject | None]:
        """The claim as it will be prepared (`PrepareStarted`) and its CDI devices' edits by
        name (None when it has no device of ours); nothing is written. `read` is the claim and
        its config entries (`_read`), `others` the claims prepared so far. Raises PrepareError."""
        claim, entries = read
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(
                f"ResourceClaim {ref} has UID {uid}, not {ref.uid}: it was deleted and re-created",
                RECREATED,
            )
        allocated = _allocated(ref, claim)
        if allocated is None:
            raise PrepareError(f"ResourceClaim {ref} is not allocated", NOT_ALLOCATED)
        if isinstance(entries, PrepareError):
            raise entries
        admin = admin_requests(claim)
        devices: list[PreparedDevice] = []
        asked: list[Asked] = []
        edits: dict[str, JsonObject] = {}
        for index, result in enumerate(allocated.get("results") or []):
            if result.get("driver") != self.driver:
                continue
            one, cdi_name, device_edits = self._result(ref, index, result, entries, admin, others)
            device = one.device
            edits.setdefault(cdi_name, device_edits)
            first = next((d for d in devices if d.mps is not None), None)
            if device.mps is not None and first is not None and first.device != device.device:
                raise PrepareError(
                    second_mps_device(str(ref), first.device, device.device, index), INVALID_CONFIG
                )
            devices.append(device)
            asked.append(one)
        # the one admission step: nothing is written before it
        refused = refusal(str(ref), asked, {u: c for u, c in others.items() if u != ref.uid})
        if refused is not None:
            raise PrepareError(*refused)
        self._check_held_elsewhere(ref, devices)
        planned = PreparedClaim(ref.namespace, ref.name, tuple(devices), STARTED)
        return planned, (edits if edits else None)

    def _check_held_elsewhere(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        """Raises PrepareError when a device plugin has one of `devices` now."""
        if self._held_elsewhere is None:
            return
        for device in devices:
            if (why := self._held_elsewhere(device.device)) is not None:
                raise PrepareError(
                    f"ResourceClaim {ref}: device {device.device}: {why}", HELD_ELSEWHERE
                )

    def _result(
        self,
        ref: ClaimRef,
        index: int,
        result: JsonObject,
        entries: Sequence[ConfigEntry],
        admin_asked: frozenset[str],
        others: Mapping[str, PreparedClaim],
    ) -> tuple[Asked, str, JsonObject]:
        """One allocation result of ours: the device as the kubelet is told of it (with what
        admission checks of it), its CDI device name and edits; `admin_asked` are the requests
        whose spec asks admin access, `others` the claims prepared so far (for its MPS daemon's
        namespace). Admin access, taken only where the spec asked for it, gets the device as it
        is (no sharing settings: a monitor must not change how others share it); a share ID
        names its own CDI device."""
        name, pool = str(result.get("device", "")), str(result.get("pool", ""))
        request = str(result.get("request", ""))
        found = self._devices.by_name.get(name) if pool == self.pool else None
        cutting = self._devices.partitions.get(name) if pool == self.pool else None
        if found is None and cutting is not None:
            if self._cutter is None:
                raise PrepareError(
                    f"ResourceClaim {ref}: device {name!r} is a dynamic MIG partition and this"
                    " driver's NVML cannot cut one",
                    NO_CUTTER,
                )
            found = (cutting[0], None)
        if found is None:
            raise PrepareError(
                f"ResourceClaim {ref}: device {name!r} of pool {pool!r} is not a device "
                f"{self.driver} publishes on this node (pool {self.pool!r})",
                UNKNOWN_DEVICE,
            )
        share = str(result.get("shareID") or "")
        if share and (problem := uid_problem(share)) is not None:
            raise PrepareError(
                f"ResourceClaim {ref}: {RESULTS_PATH}[{index}].shareID: {problem}", INVALID_CONFIG
            )
        admin = result.get("adminAccess") is True
        if admin and request not in admin_asked:
            raise PrepareError(
                f"ResourceClaim {ref}: {RESULTS_PATH}[{index}].adminAccess: request"
                f" {request!r} of spec.devices.requests does not ask for admin access",
                INVALID_CONFIG,
            )
        try:
            mig = found[1] is not None or cutting is not None
            settings = EXCLUSIVE if admin else settings_for(entries, request, name, mig)
        except OpaqueConfigError as err:
            raise PrepareError(f"ResourceClaim {ref}: {err}", INVALID_CONFIG) from err
        where = f"ResourceClaim {ref}: {RESULTS_PATH}[{index}]"
        try:
            limit = share_limit(result, name, self._devices.not_shareable(name))
            refuse_time_slicing(limit, settings.sharing, settings.origin)
        except ShareError as err:
            raise PrepareError(f"{where}{err}", INVALID_CONFIG) from err
        try:  # a partition's nodes are known once it is cut (`_cut`)
            edits = {} if cutting else device_edits(*found, *self._devices.cdi)
        except CdiError as err:
            raise PrepareError(f"ResourceClaim {ref}: {err}", HOST_FILES) from err
        env = device_env(name, settings, admin, share)
        daemon = None
        if settings.mps is not None:
            daemon, client = self._mps_client(ref, name, found, settings, limit, others)
            env.extend(client["env"])
            edits["mounts"] = [*edits.get("mounts", []), *client["mounts"]]
        if limit is not None:
            env.append(f"{MEMORY_LIMIT_ENV}={limit}")
            edits["hooks"] = [
                self._cap(f"{where}.consumedCapacity.{MEMORY}", ref, share, found[0], limit)
            ]
        if env:
            edits["env"] = env
        cdi_name = cdi_device_name(ref.uid, name, share)
        device = PreparedDevice(
            requests=(request,),
            pool=pool,
            device=name,
            cdi_ids=(f"{cdi_kind(self.driver)}={cdi_name}",),
            admin_access=admin,
            share_id=share,
            sharing=settings.sharing,
            interval=settings.interval,
            partition=None
            if cutting is None
            else MigPartition(cutting[0].uuid, cutting[1].profile_id, cutting[2], cutting[3]),
            mps=daemon,
            memory=limit or 0,
        )
        capacity = (found[1] or found[0]).memory_mib * MIB
        return Asked(index, device, settings.origin, capacity), cdi_name, edits

    def _mps_client(
        self,
        ref: ClaimRef,
        name: str,
        found: tuple[Gpu, MigDevice | None],
        settings: DeviceSettings,
        share: int | None,
        others: Mapping[str, PreparedClaim],
    ) -> tuple[MpsDaemon, JsonObject]:
        """The daemon `name` is prepared with (started at commit) and the edits that reach it
        with the claim's limits, at most its memory share or the device's memory. Refused when
        the daemon serves `others` of a namespace the claim's may not share one with."""
        assert settings.mps is not None
        field = f"{settings.origin}.opaque.parameters.sharing.strategy"
        if self._mps is None:
            raise PrepareError(f"ResourceClaim {ref}: {field}: this driver runs no MPS", MPS_DAEMON)
        if (refused := self._mps.refusal(name, ref.namespace, others)) is not None:
            raise PrepareError(f"ResourceClaim {ref}: {refused}", MPS_TENANT)
        root = self._devices.options.driver_root
        try:
            control_program(root)
        except ConfigError:
            why = f"MPS needs NVIDIA's control program, and the driver root {root} has no"
            raise PrepareError(
                f"ResourceClaim {ref}: {field}: {why} executable {CONTROL_PROGRAM}", MPS_DAEMON
            ) from None
        device = found[1] or found[0]
        home = self._mps.home(name)
        ceiling, what = device.memory_mib * MIB, f"the memory of {name}"
        if share is not None:
            ceiling, what = share, f"the claim's memory share of {name}"
        try:
            client = client_edits(settings.mps, device.uuid, ceiling, what, home)
        except OpaqueConfigError as err:
            raise PrepareError(f"ResourceClaim {ref}: {err}", INVALID_CONFIG) from err
        return MpsDaemon(device.uuid, home.pipe_dir), client

    def _cap(self, field: str, ref: ClaimRef, share: str, gpu: Gpu, limit: int) -> JsonObject:
        """The hook that caps a share; PrepareError when this GPU's cap cannot be set."""
        hook = self._devices.limit_hook
        if hook is None:
            why = "this driver has no memory-limit hook installed (see its start-up log)"
        elif gpu.uuid not in self._devices.limited:
            why = (
                f"the NVML of {gpu.uuid} has no per-cgroup memory limits"
                " (nvmlDeviceSetMemoryLimits_v1)"
            )
        else:
            return hook.edit(ref.uid, share, gpu.uuid, limit)
        raise PrepareError(f"{field}: a share cannot be capped: {why}", INVALID_CONFIG)

    def _spec(self, edits: Mapping[str, JsonObject]) -> JsonObject:
        spec: JsonObject = {
            "cdiVersion": "",
            "kind": cdi_kind(self.driver),
            "devices": [{"name": name, "containerEdits": e} for name, e in edits.items()],
            "containerEdits": common_edits(*self._devices.cdi),
        }
        spec["cdiVersion"] = minimum_cdi_version(spec)
        return spec

    async def _commit(
        self, fresh: Mapping[str, tuple[PreparedClaim, JsonObject | None]]
    ) -> dict[str, Outcome]:
        """Prepare the planned claims: checkpointed as started, their MIG partitions cut and
        checkpointed with what was made, their specs written, then checkpointed as complete. A
        claim whose partition cannot be cut or whose spec cannot be written fails alone; a
        checkpoint that cannot be saved fails them all, specs removed and partitions destroyed
        (entries left `PrepareStarted` are rolled back at the next start, or prepared again on
        the kubelet's retry)."""
        started = {**self._claims, **{uid: claim for uid, (claim, _) in fresh.items()}}
        try:
            await asyncio.to_thread(self._checkpoint.save, started)
        except OSError as err:
            return self._all_failed(fresh, self._save_failed(err), CHECKPOINT)
        self._claims = started
        outcomes: dict[str, Outcome] = {}
        fresh = await self._cut(fresh, outcomes)
        if any(c.partitions for c, _ in fresh.values()):
            kept = {u: c for u, c in self._claims.items() if u not in outcomes}
            try:
                await asyncio.to_thread(self._checkpoint.save, kept)
            except OSError as err:
                await self._release_all(fresh)
                return self._all_failed(fresh, self._save_failed(err), CHECKPOINT)
            self._claims = kept
        for uid, (claim, edits) in fresh.items():
            if edits is None or uid in outcomes:
                continue
            path = self.spec_path(uid)
            try:
                await asyncio.to_thread(SpecWriter(path).write, self._spec(edits))
            except OSError as err:
                why = f"ResourceClaim {claim.namespace}/{claim.name}: writing CDI spec {path}: "
                outcomes[uid] = Outcome(error=why + describe(err), reason=CDI_SPEC)
                _log_failed(claim, uid, outcomes[uid].error)
                await self._release(claim)
        self._failpoints.reach(PREPARE_AFTER_CDI_SPEC)
        done = {
            uid: replace(claim, state=COMPLETED)
            for uid, (claim, _) in fresh.items()
            if uid not in outcomes
        }
        after = {u: c for u, c in self._claims.items() if u not in outcomes} | done
        try:
            await asyncio.to_thread(self._checkpoint.save, after)
        except OSError as err:
            for uid in fresh:
                await self._remove_orphan(uid)
            await self._release_all(fresh)
            return self._all_failed(fresh, self._save_failed(err), CHECKPOINT)
        self._claims = after
        self._failpoints.reach(PREPARE_AFTER_CHECKPOINT)
        for uid, claim in done.items():
            log_event(
                logger,
                "dra.claim.prepared",
                claim=f"{claim.namespace}/{claim.name}",
                uid=uid,
                devices=[d.device for d in claim.devices],
            )
            outcomes[uid] = Outcome(claim.devices)
        return outcomes

    async def _cut(
        self,
        fresh: Mapping[str, tuple[PreparedClaim, JsonObject | None]],
        outcomes: dict[str, Outcome],
    ) -> dict[str, tuple[PreparedClaim, JsonObject | None]]:
        """`fresh` with each claim's MIG partitions cut (`migcut.py`, off the loop) and their
        device nodes in its edits, each GPU instance checkpointed before its compute instance
        is made; a claim that cannot be cut gets its outcome here, nothing of it left on the
        GPUs."""
        cut = dict(fresh)
        for uid, (claim, edits) in fresh.items():
            wanted = [p for d in claim.devices if (p := d.partition) is not None]
            if not wanted or self._cutter is None or edits is None:
                continue
            held = [p for u, c in self._claims.items() if u != uid for p in c.partitions]
            record = functools.partial(self._record_cut, uid, claim)
            try:
                made = await asyncio.to_thread(self._cutter.cut, wanted, held, record)
            except CutError as err:
                why = f"ResourceClaim {claim.namespace}/{claim.name}: {err}"
                outcomes[uid] = Outcome(error=why, reason=err.reason)
                _log_failed(claim, uid, why)
                continue
            claim = _with_partitions(claim, made)
            self._claims[uid] = claim
            try:
                edits = {**edits, **self._cut_edits(claim, edits)}
            except CdiError as err:
                why = f"ResourceClaim {claim.namespace}/{claim.name}: {err}"
                outcomes[uid] = Outcome(error=why, reason=HOST_FILES)
                _log_failed(claim, uid, why)
                await self._release(claim)
                continue
            cut[uid] = (claim, edits)
        return cut

    def _record_cut(self, uid: str, claim: PreparedClaim, cut: Sequence[MigPartition]) -> None:
        """Checkpoint the claim with its partitions as cut so far (in the cutter's thread, the
        loop waiting on it under the locks). Raises CutError."""
        try:
            self._checkpoint.save({**self._claims, uid: _with_partitions(claim, cut)})
        except OSError as err:
            raise CutError(self._save_failed(err), CHECKPOINT) from err

    def _cut_edits(self, claim: PreparedClaim, edits: JsonObject) -> JsonObject:
        """The CDI devices of the claim's cut partitions with their device nodes. Raises
        CdiError."""
        found = {}
        for device in claim.devices:
            if device.partition is None:
                continue
            gpu, profile, _, _ = self._devices.partitions[device.device]
            mig = cut_device(device.partition, profile)
            (cdi_name,) = (i.partition("=")[2] for i in device.cdi_ids)
            found[cdi_name] = {**edits[cdi_name], **device_edits(gpu, mig, *self._devices.cdi)}
        return found

    async def _release(self, claim: PreparedClaim) -> str:
        """The claim's MIG partitions destroyed (off the loop); why not, or ""."""
        for partition in claim.partitions:
            if self._cutter is None:
                return f"{partition}: this driver cannot remove MIG partitions"
            try:
                await asyncio.to_thread(self._cutter.release, partition)
            except DevicePluginError as err:
                return f"removing MIG partition {partition}: {err}"
        return ""

    async def _release_all(
        self, fresh: Mapping[str, tuple[PreparedClaim, JsonObject | None]]
    ) -> None:
        for uid, (claim, _) in fresh.items():
            if why := await self._release(claim):
                log_event(logger, "dra.mig.orphaned", logging.ERROR, uid=uid, error=why)

    def _all_failed(self, fresh: Mapping[str, object], why: str, reason: str) -> dict[str, Outcome]:
        log_event(logger, "dra.checkpoint.failed", logging.ERROR, error=why)
        return {uid: Outcome(error=why, reason=reason) for uid in fresh}

    async def _remove_orphan(self, uid: str) -> None:
        try:
            await asyncio.to_thread(SpecWriter(self.spec_path(uid)).remove)
        except OSError:
            log_event(logger, "dra.spec.orphaned", logging.WARNING, path=str(self.spec_path(uid)))


@contextlib.asynccontextmanager
async def _both(lock: asyncio.Lock, node_lock: NodeLock) -> AsyncIterator[None]:
    async with lock, node_lock.held():
        yield


def _allocated(ref: ClaimRef, claim: JsonObject) -> JsonObject | None:
    """The claim's `status.allocation.devices` ({} when it has none), None when it is not
    allocated; each level an object and each result too. Raises PrepareError naming the
    field that is not."""
    _must_be_object(ref, "the API server's answer", claim)
    status = claim.get("status") or {}
    _must_be_object(ref, "status", status)
    allocation = status.get("allocation")
    if not allocation:
        return None
    _must_be_object(ref, "status.allocation", allocation)
    devices = allocation.get("devices") or {}
    _must_be_object(ref, "status.allocation.devices", devices)
    results = devices.get("results") or []
    if not isinstance(results, list):
        raise PrepareError(f"ResourceClaim {ref}: {RESULTS_PATH}: not a list", INVALID_CONFIG)
    for index, result in enumerate(results):
        _must_be_object(ref, f"{RESULTS_PATH}[{index}]", result)
    return devices


def _must_be_object(ref: ClaimRef, field: str, value: object) -> None:
    if not isinstance(value, dict):
        why = f"not an object (a {type(value).__name__})"
        raise PrepareError(f"ResourceClaim {ref}: {field}: {why}", INVALID_CONFIG)


def _with_partitions(claim: PreparedClaim, partitions: Sequence[MigPartition]) -> PreparedClaim:
    """The claim with its partitions' devices' records replaced, in order, by `partitions`."""
    new = iter(partitions)
    devices = tuple(replace(d, partition=next(new)) if d.partition else d for d in claim.devices)
    return replace(claim, devices=devices)


def _log_failed(claim: ClaimRef | PreparedClaim, uid: str, error: str) -> None:
    log_event(
        logger,
        "dra.claim.failed",
        logging.WARNING,
        claim=f"{claim.namespace}/{claim.name}",
        uid=uid,
        error=error,
    )
