"""Dynamic MIG at Prepare and Unprepare: a claim's partitions cut (a GPU instance at the chosen
placement and its full-size compute instance), removed again, and at start-up whatever this
driver cut for a claim that never completed destroyed, while instances someone else made are
left alone and reported.

Ownership is what the checkpoint records (`migrecord.py`): a partition is recorded before its
GPU instance is created, and again with the GPU instance's id before its compute instance is
made (`record`, called between the two). Only an instance this driver can prove it made is
destroyed: the recorded profile, placement and GPU-instance id, and the compute-instance id
where one is recorded, all matching what the GPU has. Any other instance, one an operator made
at the same placement after a crash included, is left alone with a log line. An instance no
recorded partition accounts for is foreign: never destroyed, and the partitions (and whole GPU)
it overlaps are published tainted (`blocked`), so the scheduler does not pick them. A placement
found taken at Prepare fails that claim and leaves the instance as it is.

MIG mode: a GPU whose mode is off (Hopper and later change it at once) is turned on by the
first cut and off by the removal of the last instance on it, only when this driver turned it
on; an Ampere GPU whose mode would only change after a reset is refused, and left as it was.

Every method blocks on NVML: call it off the event loop. Calls for one GPU are serialized by
`MigControl`'s lock per GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from deviceplugin.dra.failpoints import (
    PREPARE_AFTER_COMPUTE_INSTANCE,
    PREPARE_AFTER_GPU_INSTANCE,
    PREPARE_BEFORE_GPU_INSTANCE,
    Failpoints,
)
from deviceplugin.dra.migrecord import MigPartition
from deviceplugin.model.devices import Gpu, Inventory, MigDevice, MigProfile
from deviceplugin.model.errors import DevicePluginError, NvmlError
from deviceplugin.model.log import log_event
from deviceplugin.model.migpartitions import partition_name, partitionable, partitions
from deviceplugin.model.record import record
from deviceplugin.model.slices import device_name
from deviceplugin.node.nvml_mig import MIG_DISABLE, MIG_ENABLE, GpuInstance, MigControl

logger = logging.getLogger(__name__)

# Why a partition could not be cut: the `reason` label of the prepare-failure metric.
PLACEMENT_TAKEN = "mig-placement-taken"
CUT_FAILED = "mig-cut-failed"

# Checkpoints a claim's partitions as cut so far (each of `wanted`, those not yet reached as
# recorded); raises CutError when it cannot.
Recorder = Callable[[Sequence[MigPartition]], None]


class CutError(DevicePluginError):
    """A partition could not be cut; what this attempt made is destroyed again."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@record(frozen=True)
class ForeignInstance:
    """A GPU instance on a partitionable GPU that no recorded partition accounts for."""

    gpu: str
    minor: int
    instance: GpuInstance

    def describe(self) -> str:
        i = self.instance
        return f"{self.gpu}: GPU instance {i.id} (profile {i.profile_id}) at {i.start}+{i.size}"


class MigCutter:
    """Cuts and removes the partitions of claims on the GPUs of one `MigControl`."""

    def __init__(self, control: MigControl, failpoints: Failpoints | None = None) -> None:
        self._control = control
        self._failpoints = failpoints or Failpoints()

    def cut(
        self, wanted: Sequence[MigPartition], held: Iterable[MigPartition], record: Recorder
    ) -> list[MigPartition]:
        """Cut each of `wanted` (recorded, not yet cut), `held` being the partitions other
        claims hold, each GPU instance's id passed to `record` before its compute instance is
        made; the same partitions with what was made. Raises CutError, after destroying what
        this call made."""
        held = list(held)
        done: list[MigPartition] = []
        try:
            for n, partition in enumerate(wanted):

                def record_one(made: MigPartition, n: int = n) -> None:
                    record([*done, made, *wanted[n + 1 :]])

                done.append(self._cut_one(partition, [*held, *done], record_one))
        except (CutError, NvmlError) as err:
            for made in reversed(done):
                self._release_logged(made)
            if isinstance(err, CutError):
                raise
            raise CutError(str(err), CUT_FAILED) from err
        return done

    def release(self, partition: MigPartition) -> None:
        """Destroy the partition's compute and GPU instance when this driver provably made them
        (gone already counts as done; another instance at the placement is left alone, logged),
        and turn MIG mode off where this driver turned it on and no instance is left. Raises
        NvmlError."""
        control, gpu = self._control, partition.gpu
        with control.gpu(gpu):
            for instance in control.gpu_instances(gpu):
                if _made(instance, partition):
                    control.destroy(gpu, instance.id, instance.compute_instances)
                    log_event(logger, "dra.mig.destroyed", gpu=gpu, gpu_instance=instance.id)
                elif instance.overlaps(partition.start, partition.size):
                    log_event(
                        logger,
                        "dra.mig.left_alone",
                        logging.WARNING,
                        gpu=gpu,
                        gpu_instance=instance.id,
                        compute_instances=list(instance.compute_instances),
                        recorded=_recorded(partition),
                        hint="not the instance this driver recorded for the partition",
                    )
            if partition.enabled_mig_mode and not control.gpu_instances(gpu):
                try:
                    control.set_mig_mode(gpu, MIG_DISABLE)
                    log_event(logger, "dra.mig.mode_off", gpu=gpu)
                except NvmlError as err:  # in use, or not allowed: left on
                    log_event(logger, "dra.mig.mode_kept", logging.WARNING, gpu=gpu, error=str(err))

    def foreign(
        self, inventory: Inventory, recorded: Iterable[MigPartition]
    ) -> list[ForeignInstance]:
        """The GPU instances on the partitionable GPUs that no partition of `recorded`
        accounts for; a GPU that cannot be read is logged and skipped."""
        mine = list(recorded)
        found = []
        for gpu in inventory.gpus:
            if not partitionable(gpu):
                continue
            try:
                with self._control.gpu(gpu.uuid):
                    instances = self._control.gpu_instances(gpu.uuid)
            except NvmlError as err:
                log_event(
                    logger, "dra.mig.scan_failed", logging.WARNING, gpu=gpu.uuid, error=str(err)
                )
                continue
            for instance in instances:
                if not any(p.gpu == gpu.uuid and _accounted(instance, p) for p in mine):
                    found.append(ForeignInstance(gpu.uuid, gpu.minor, instance))
        return found

    # --- internals ------------------------------------------------------------------------------

    def _cut_one(
        self,
        partition: MigPartition,
        held: Sequence[MigPartition],
        record: Callable[[MigPartition], None],
    ) -> MigPartition:
        control, gpu = self._control, partition.gpu
        with control.gpu(gpu):
            self._failpoints.reach(PREPARE_BEFORE_GPU_INSTANCE)
            enabled = self._mig_mode_on(partition, held)
            for instance in control.gpu_instances(gpu):
                if instance.overlaps(partition.start, partition.size):
                    raise CutError(
                        f"MIG placement {partition.start}+{partition.size} of {gpu} is taken by "
                        f"GPU instance {instance.id} (profile {instance.profile_id}, at "
                        f"{instance.start}+{instance.size}), which this driver did not create "
                        "for this claim; it is left alone",
                        PLACEMENT_TAKEN,
                    )
            gi_id = control.create_gpu_instance(
                gpu, partition.profile_id, partition.start, partition.size
            )
            try:
                record(replace(partition, gpu_instance=gi_id, enabled_mig_mode=enabled))
                self._failpoints.reach(PREPARE_AFTER_GPU_INSTANCE)
                made = control.create_compute_instance(gpu, gi_id)
            except (CutError, NvmlError):
                control.destroy(gpu, gi_id, ())
                raise
            self._failpoints.reach(PREPARE_AFTER_COMPUTE_INSTANCE)
        log_event(
            logger,
            "dra.mig.created",
            gpu=gpu,
            profile_id=partition.profile_id,
            start=partition.start,
            gpu_instance=made.gpu_instance,
            compute_instance=made.compute_instance,
            uuid=made.uuid,
        )
        return replace(
            partition,
            gpu_instance=made.gpu_instance,
            compute_instance=made.compute_instance,
            uuid=made.uuid,
            enabled_mig_mode=enabled,
        )

    def _mig_mode_on(self, partition: MigPartition, held: Sequence[MigPartition]) -> bool:
        """MIG mode on (turned on now when off); True when this driver turned it on, now or
        for a partition still held. Raises CutError when it does not take effect at once."""
        control, gpu = self._control, partition.gpu
        if control.mig_mode(gpu)[0] == MIG_ENABLE:
            return any(h.gpu == gpu and h.enabled_mig_mode for h in held)
        control.set_mig_mode(gpu, MIG_ENABLE)
        if control.mig_mode(gpu)[0] != MIG_ENABLE:
            control.set_mig_mode(gpu, MIG_DISABLE)  # left as it was
            raise CutError(
                f"MIG mode of {gpu} is off and turns on only after a GPU reset (Ampere); "
                "enable it on the node first",
                CUT_FAILED,
            )
        log_event(logger, "dra.mig.mode_on", gpu=gpu)
        return True

    def _release_logged(self, partition: MigPartition) -> None:
        try:
            self.release(partition)
        except NvmlError as err:
            log_event(
                logger, "dra.mig.orphaned", logging.ERROR, partition=str(partition), error=str(err)
            )


def _placed(instance: GpuInstance, partition: MigPartition) -> bool:
    """Whether `instance` has the partition's profile and placement."""
    return (instance.profile_id, instance.start, instance.size) == (
        partition.profile_id,
        partition.start,
        partition.size,
    )


def _accounted(instance: GpuInstance, partition: MigPartition) -> bool:
    """Whether the partition accounts for `instance`, so it is not foreign: at its placement,
    with the recorded id once there is one (before, it may be being cut now)."""
    return _placed(instance, partition) and partition.gpu_instance in (-1, instance.id)


def _made(instance: GpuInstance, partition: MigPartition) -> bool:
    """Whether this driver provably made `instance` for the partition: at its placement, with
    the recorded GPU-instance id, and the recorded compute instance among its own."""
    return (
        _placed(instance, partition)
        and partition.gpu_instance == instance.id
        and partition.compute_instance in (-1, *instance.compute_instances)
    )


def _recorded(partition: MigPartition) -> str:
    ids = [
        ("GPU instance", partition.gpu_instance),
        ("compute instance", partition.compute_instance),
    ]
    known = [f"{what} {value}" for what, value in ids if value >= 0]
    return f"{partition}, {', '.join(known) or 'no instance id'}"


def cut_device(partition: MigPartition, profile: MigProfile) -> MigDevice:
    """The MIG device a cut partition is, as CDI edits name it (its index among the GPU's MIG
    devices is not read: -1; its GPU and compute slices are the profile's `<n>g`)."""
    slices = int(profile.name.partition("g")[0])
    return MigDevice(
        uuid=partition.uuid,
        index=-1,
        gpu_instance_id=partition.gpu_instance,
        compute_instance_id=partition.compute_instance,
        profile=profile.name,
        memory_mib=profile.memory_mib,
        gpu_slices=slices,
        compute_slices=slices,
    )


def blocked(inventory: Inventory, foreign: Iterable[ForeignInstance]) -> dict[str, str]:
    """Device name -> why it cannot be allocated: each partition a foreign instance overlaps,
    and the whole GPU."""
    by_uuid: Mapping[str, Gpu] = {gpu.uuid: gpu for gpu in inventory.gpus}
    found: dict[str, str] = {}
    for item in foreign:
        gpu = by_uuid.get(item.gpu)
        if gpu is None:
            continue
        why = f"gpu-instance-{item.instance.id}"
        found.setdefault(device_name(gpu, None), why)
        for profile, start, size in partitions(gpu):
            if item.instance.overlaps(start, size):
                found.setdefault(partition_name(gpu, profile, start), why)
    return found
