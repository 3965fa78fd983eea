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
  access, the share ID), and the driver's common edits at spec level (applied once when any
  device of the claim is injected);
- file `k8s.gpu.nvidia.com-claim_<uid>.json` in the CDI directory (the transient-spec name CDI
  libraries use), so Unprepare finds it from the UID alone, even without a checkpoint entry.

A claim that cannot be prepared (not found, not allocated, re-created with another UID, a
device this node does not publish, a spec that cannot be written) gets an error string in its
own entry; the other claims of the call are prepared anyway. A claim reference whose UID is not
a UID, or whose namespace or name Kubernetes would not allow, is refused before anything is
read or written: the UID names the claim's spec file. A claim already prepared is
answered from the checkpoint, without asking the API server. Unprepare removes the spec and the
checkpoint entry; an unknown claim is already unprepared.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deviceplugin.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
)
from deviceplugin.dra.kubeapi import KubeApiError
from deviceplugin.dra.opaque import (
    EXCLUSIVE,
    ConfigEntry,
    DeviceSettings,
    OpaqueConfigError,
    device_env,
    read_entries,
    settings_for,
)
from deviceplugin.model.cdi import (
    CdiError,
    CdiOptions,
    HostScan,
    common_edits,
    device_edits,
    minimum_cdi_version,
)
from deviceplugin.model.devices import Gpu, Inventory, MigDevice
from deviceplugin.model.errors import DevicePluginError
from deviceplugin.model.kubenames import dns_label_problem, dns_subdomain_problem, uid_problem
from deviceplugin.model.log import log_event
from deviceplugin.model.slices import device_name, physical_devices
from deviceplugin.node.cdiwriter import SpecWriter, describe

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
CDI_CLASS = "claim"
RESULTS_PATH = "status.allocation.devices.results"


class ClaimReader(Protocol):
    """Reads a ResourceClaim (`kubeapi.KubeApi`); raises KubeApiError."""

    async def read_claim(self, namespace: str, name: str) -> JsonObject: ...


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Outcome:
    """One claim's answer: its devices, or why it could not be prepared."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class PrepareError(DevicePluginError):
    """This claim cannot be prepared; the message goes to the kubelet as the claim's error."""


@dataclass(frozen=True)
class NodeDevices:
    """What allocation results are mapped to: each published device name with the GPU (and MIG
    device) behind it, the host's files and the CDI options."""

    by_name: Mapping[str, tuple[Gpu, MigDevice | None]]
    scan: HostScan
    options: CdiOptions

    @property
    def cdi(self) -> tuple[HostScan, CdiOptions]:
        return self.scan, self.options

    @classmethod
    def build(cls, inventory: Inventory, scan: HostScan, options: CdiOptions) -> NodeDevices:
        """Only devices the slices publish: a MIG-enabled GPU is published as its MIG devices,
        not whole, so its own name is unknown here too."""
        by_name = {device_name(gpu, mig): (gpu, mig) for gpu, mig in physical_devices(inventory)}
        return cls(by_name, scan, options)


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
    """Prepares and unprepares claims for one driver and pool (the node). Calls are serialised
    where they touch files, so concurrent kubelet calls cannot interleave a checkpoint write."""

    def __init__(
        self,
        reader: ClaimReader,
        checkpoint: Checkpoint,
        cdi_dir: Path,
        driver: str,
        pool: str,
        devices: NodeDevices,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.cdi_dir = cdi_dir
        self._reader = reader
        self._checkpoint = checkpoint
        self._devices = devices
        self._claims: dict[str, PreparedClaim] = {}
        self._lock = asyncio.Lock()

    def load(self) -> None:
        """Adopt the checkpoint. One that cannot be trusted is logged and set aside: claims it
        held are prepared again from the API server when the kubelet asks, and their specs are
        found by UID when it unprepares."""
        try:
            self._claims = self._checkpoint.load()
        except CheckpointError as err:
            log_event(logger, "dra.checkpoint.unusable", logging.ERROR, error=str(err))
            self._claims = {}
            return
        log_event(logger, "dra.checkpoint.loaded", claims=len(self._claims))

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
        return dict(self._claims)

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / spec_file_name(self.driver, uid)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """One outcome per claim UID."""
        outcomes = {uid: Outcome(error=why) for uid, why in _refused(claims).items()}
        for ref in claims:
            if ref.uid not in outcomes and (known := self._done(ref)) is not None:
                outcomes[ref.uid] = Outcome(known.devices)
        todo = [ref for ref in claims if ref.uid not in outcomes]
        read = await asyncio.gather(*(self._read(ref) for ref in todo))
        async with self._lock:
            fresh: dict[str, PreparedClaim] = {}
            for ref, found in zip(todo, read, strict=True):
                known = self._done(ref)
                if known is not None:
                    outcomes[ref.uid] = Outcome(known.devices)
                    continue
                try:
                    if isinstance(found, PrepareError):
                        raise found
                    fresh[ref.uid] = self._prepare(ref, found, {**self._claims, **fresh})
                except PrepareError as err:
                    log_event(
                        logger,
                        "dra.claim.failed",
                        logging.WARNING,
                        claim=str(ref),
                        uid=ref.uid,
                        error=str(err),
                    )
                    outcomes[ref.uid] = Outcome(error=str(err))
            if fresh:
                outcomes.update(self._commit(fresh))
        return {ref.uid: outcomes[ref.uid] for ref in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """An error string per claim UID, empty when it is unprepared (or never was)."""
        errors = _refused(claims)
        async with self._lock:
            removed: dict[str, PreparedClaim] = {}
            for ref in claims:
                if ref.uid in errors:
                    continue
                try:
                    SpecWriter(self.spec_path(ref.uid)).remove()
                except OSError as err:
                    errors[ref.uid] = (
                        f"removing CDI spec {self.spec_path(ref.uid)}: {describe(err)}"
                    )
                    continue
                errors[ref.uid] = ""
                known = self._claims.pop(ref.uid, None)
                if known is not None:
                    removed[ref.uid] = known
            if removed:
                try:
                    self._checkpoint.save(self._claims)
                except OSError as err:
                    self._claims.update(removed)  # a retry saves again
                    for uid in removed:
                        errors[uid] = f"saving checkpoint {self._checkpoint.path}: {describe(err)}"
            for uid, claim in removed.items():
                if not errors[uid]:
                    log_event(
                        logger, "dra.claim.unprepared", claim=f"{claim.namespace}/{claim.name}"
                    )
        return {ref.uid: errors[ref.uid] for ref in claims}

    # --- internals ------------------------------------------------------------------------------

    def _done(self, ref: ClaimRef) -> PreparedClaim | None:
        """The checkpointed claim, while its spec is still on disk (a claim with no devices of
        ours has none)."""
        known = self._claims.get(ref.uid)
        if known is None or (known.devices and not self.spec_path(ref.uid).exists()):
            return None
        return known

    async def _read(self, ref: ClaimRef) -> JsonObject | PrepareError:
        try:
            return await self._reader.read_claim(ref.namespace, ref.name)
        except KubeApiError as err:
            if err.status == 404:
                return PrepareError(f"ResourceClaim {ref} not found")
            return PrepareError(f"reading ResourceClaim {ref}: {err}")

    def _prepare(
        self, ref: ClaimRef, claim: JsonObject, others: Mapping[str, PreparedClaim]
    ) -> PreparedClaim:
        """Write the claim's spec; the checkpoint is written by the caller. `others` are the
        claims prepared so far. Raises PrepareError."""
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(
                f"ResourceClaim {ref} has UID {uid}, not {ref.uid}: it was deleted and re-created"
            )
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"ResourceClaim {ref} is not allocated")
        allocated = allocation.get("devices") or {}
        try:
            entries = read_entries(allocated, self.driver)
        except OpaqueConfigError as err:
            raise PrepareError(f"ResourceClaim {ref}: {err}") from err
        devices = []
        edits: dict[str, JsonObject] = {}
        for index, result in enumerate(allocated.get("results") or []):
            if result.get("driver") != self.driver:
                continue
            device, cdi_name, device_edits = self._result(ref, index, result, entries, others)
            edits.setdefault(cdi_name, device_edits)
            devices.append(device)
        if edits:
            self._write_spec(ref, cdi_kind(self.driver), edits)
        return PreparedClaim(ref.namespace, ref.name, tuple(devices))

    def _result(
        self,
        ref: ClaimRef,
        index: int,
        result: JsonObject,
        entries: Sequence[ConfigEntry],
        others: Mapping[str, PreparedClaim],
    ) -> tuple[PreparedDevice, str, JsonObject]:
        """One allocation result of ours: the device as the kubelet is told of it, its CDI
        device name and edits. Admin access gets the device as it is (no sharing settings: a
        monitor must not change how others share it); a share ID names its own CDI device."""
        name, pool = str(result.get("device", "")), str(result.get("pool", ""))
        request = str(result.get("request", ""))
        found = self._devices.by_name.get(name) if pool == self.pool else None
        if found is None:
            raise PrepareError(
                f"ResourceClaim {ref}: device {name!r} of pool {pool!r} is not a device "
                f"{self.driver} publishes on this node (pool {self.pool!r})"
            )
        share = str(result.get("shareID") or "")
        if share and (problem := uid_problem(share)) is not None:
            raise PrepareError(f"ResourceClaim {ref}: {RESULTS_PATH}[{index}].shareID: {problem}")
        admin = result.get("adminAccess") is True
        try:
            settings = EXCLUSIVE if admin else settings_for(entries, request, name, bool(found[1]))
            edits = device_edits(*found, *self._devices.cdi)
        except (OpaqueConfigError, CdiError) as err:
            raise PrepareError(f"ResourceClaim {ref}: {err}") from err
        self._check_time_slice(ref, name, settings, others)
        env = device_env(name, settings, admin, share)
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
        )
        return device, cdi_name, edits

    def _check_time_slice(
        self,
        ref: ClaimRef,
        name: str,
        settings: DeviceSettings,
        others: Mapping[str, PreparedClaim],
    ) -> None:
        """A GPU has one time slice: a claim may not ask another one than a claim prepared on
        the same GPU runs. Raises PrepareError naming both."""
        if not settings.interval:
            return
        for uid, claim in others.items():
            if uid == ref.uid:
                continue
            for device in claim.devices:
                if device.device == name and device.interval not in ("", settings.interval):
                    raise PrepareError(
                        f"ResourceClaim {ref}: {settings.origin} asks time slice "
                        f"{settings.interval} for {name}, which runs {device.interval} for "
                        f"ResourceClaim {claim.namespace}/{claim.name}"
                    )

    def _write_spec(self, ref: ClaimRef, kind: str, edits: Mapping[str, JsonObject]) -> None:
        spec: JsonObject = {
            "cdiVersion": "",
            "kind": kind,
            "devices": [{"name": name, "containerEdits": e} for name, e in edits.items()],
            "containerEdits": common_edits(*self._devices.cdi),
        }
        spec["cdiVersion"] = minimum_cdi_version(spec)
        path = self.spec_path(ref.uid)
        try:
            SpecWriter(path).write(spec)
        except OSError as err:
            why = f"writing CDI spec {path}: {describe(err)}"
            raise PrepareError(f"ResourceClaim {ref}: {why}") from err

    def _commit(self, fresh: Mapping[str, PreparedClaim]) -> dict[str, Outcome]:
        """Checkpoint newly prepared claims; if that fails, undo their specs and say why."""
        self._claims.update(fresh)
        try:
            self._checkpoint.save(self._claims)
        except OSError as err:
            why = f"saving checkpoint {self._checkpoint.path}: {describe(err)}"
            log_event(logger, "dra.checkpoint.failed", logging.ERROR, error=why)
            for uid in fresh:
                del self._claims[uid]
                try:
                    SpecWriter(self.spec_path(uid)).remove()
                except OSError:
                    log_event(
                        logger, "dra.spec.orphaned", logging.WARNING, path=str(self.spec_path(uid))
                    )
            return {uid: Outcome(error=why) for uid in fresh}
        for uid, claim in fresh.items():
            log_event(
                logger,
                "dra.claim.prepared",
                claim=f"{claim.namespace}/{claim.name}",
                uid=uid,
                devices=[d.device for d in claim.devices],
            )
        return {uid: Outcome(claim.devices) for uid, claim in fresh.items()}
