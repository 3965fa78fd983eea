"""What the MPS control daemons of a plan must be: one per MPS-shared resource, with the limits
NVIDIA's `mps-control-daemon` v0.19.0 gives it, and what a daemon that is down does to its
resource's devices. Pure: `node.mpsdaemon` starts, checks and stops the daemons.

Limits (the reference's): every client gets `100 / replicas` percent of the threads, and on each
device `memory / replicas` MiB of pinned memory, named by the device's index."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from deviceplugin.model.devices import Health, Inventory
from deviceplugin.model.hostpaths import mps_paths
from deviceplugin.model.record import record
from deviceplugin.model.resources import ResourceSet


@record(frozen=True)
class DaemonSpec:
    """One control daemon: where it lives, the GPUs it serves and the limits it is told."""

    resource: str
    pipe_dir: str
    log_dir: str
    shm_dir: str
    gpu_uuids: tuple[str, ...]
    thread_percentage: int
    pinned_limits: tuple[tuple[str, str], ...]  # (device index, "<MiB>M"), by index

    def commands(self) -> tuple[str, ...]:
        """The control commands that set the limits, in the reference's order."""
        pinned = tuple(
            f"set_default_device_pinned_mem_limit {index} {limit}"
            for index, limit in self.pinned_limits
        )
        return (*pinned, f"set_default_active_thread_percentage {self.thread_percentage}")


def daemon_specs(
    resources: Mapping[str, ResourceSet], inventory: Inventory, mps_root: str | None
) -> dict[str, DaemonSpec]:
    """The daemons `resources` need, by resource name (none without MPS-shared resources)."""
    specs: dict[str, DaemonSpec] = {}
    if mps_root is None:
        return specs
    for name, resource in resources.items():
        if not resource.mps:
            continue
        uuids = tuple(dict.fromkeys(device.gpu_uuid for device in resource.devices))
        limits = []
        for uuid in uuids:
            gpu = inventory.gpu(uuid)
            if gpu is not None and gpu.memory_mib > 0:
                limits.append((str(gpu.index), f"{gpu.memory_mib // resource.replicas}M"))
        pipe, log, shm = mps_paths(mps_root, name)
        specs[name] = DaemonSpec(
            resource=name,
            pipe_dir=pipe,
            log_dir=log,
            shm_dir=shm,
            gpu_uuids=uuids,
            thread_percentage=100 // resource.replicas,
            pinned_limits=tuple(sorted(limits, key=lambda pair: int(pair[0]))),
        )
    return specs


def with_daemons_down(
    resources: Mapping[str, ResourceSet], down: Mapping[str, str]
) -> dict[str, ResourceSet]:
    """Every device of a resource whose daemon is down (`down`: resource -> why) Unhealthy."""
    result = dict(resources)
    for name, reason in down.items():
        resource = result.get(name)
        if resource is None:
            continue
        devices = tuple(
            device
            if not device.healthy
            else replace(device, health=Health.UNHEALTHY, reason=reason)
            for device in resource.devices
        )
        result[name] = replace(resource, devices=devices)
    return result
