"""A dynamic MIG partition as the checkpoint records it: what a claim's device cuts, and once
cut, what was made, so a driver that died at any step knows what is its own to destroy.

A partition is recorded in the claim's `PrepareStarted` entry before anything is created (the
GPU, the GPU-instance profile and the placement), again with the GPU-instance id once that
instance exists and before its compute instance is made, then with the compute-instance id and
the MIG device's UUID once both exist: start-up destroys only an instance whose recorded ids
match. `enabledMigMode` says this
driver turned the GPU's MIG mode on (Hopper and later); it is carried to every later partition
of that GPU, so the last one removed turns it off again. In the checkpoint it is the device's
`migPartition` object; a device without one is a whole GPU or a MIG device cut by someone else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceplugin.model.record import record


@record(frozen=True)
class MigPartition:
    """One partition of GPU `gpu` (its UUID): `profile_id` at (`start`, `size`); the ids and
    `uuid` are set once cut (-1 and "" before)."""

    gpu: str
    profile_id: int
    start: int
    size: int
    gpu_instance: int = -1
    compute_instance: int = -1
    uuid: str = ""
    enabled_mig_mode: bool = False

    def __str__(self) -> str:
        return f"{self.gpu} profile {self.profile_id} at {self.start}+{self.size}"


def partition_entry(partition: MigPartition) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "parentUUID": partition.gpu,
        "profileID": partition.profile_id,
        "placementStart": partition.start,
        "placementSize": partition.size,
    }
    made = {
        "gpuInstanceID": partition.gpu_instance,
        "computeInstanceID": partition.compute_instance,
    }
    entry.update({key: value for key, value in made.items() if value >= 0})
    if partition.uuid:
        entry["uuid"] = partition.uuid
    if partition.enabled_mig_mode:
        entry["enabledMigMode"] = True
    return entry


def read_partition(entry: Mapping[str, Any]) -> MigPartition:
    """Raises ValueError, KeyError or TypeError on an entry that is not one."""
    numbers = {
        key: entry.get(key, -1)
        for key in (
            "profileID",
            "placementStart",
            "placementSize",
            "gpuInstanceID",
            "computeInstanceID",
        )
    }
    for key, value in numbers.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"migPartition.{key}: {value!r} is not an integer")
    return MigPartition(
        gpu=str(entry["parentUUID"]),
        profile_id=numbers["profileID"],
        start=numbers["placementStart"],
        size=numbers["placementSize"],
        gpu_instance=numbers["gpuInstanceID"],
        compute_instance=numbers["computeInstanceID"],
        uuid=str(entry.get("uuid", "")),
        enabled_mig_mode=entry.get("enabledMigMode") is True,
    )
