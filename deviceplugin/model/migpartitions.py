"""Dynamic MIG (`dra serve --mig-mode dynamic`): the partitions of a MIG-capable GPU and the
counters through which the scheduler packs them (partitionable devices, KEP-4815).

A partitionable GPU is published whole and as one device per GPU-instance profile x placement
NVML allows, none of which exists yet. Names, counters and consumption are NVIDIA's DRA
driver's (v0.4.1, `cmd/gpu-kubelet-plugin/partitions.go`, `mig.go`), so its DeviceClasses and
claims select ours unchanged:

- a partition is `gpu-<minor>-mig-<profile>-<profileId>-<start>`, the profile without dots and
  made a DNS label (`1g.10gb+me` -> `1g10gb-me`), the driver's profile id and the placement's
  first memory slice;
- one counter set per GPU, `gpu-<minor>-counter-set`, holding the largest value any profile has
  of each capacity (`multiprocessors`, `copy-engines`, `decoders`, `encoders`, `jpeg-engines`,
  `ofa-engines`, `memory` in bytes) and one `memory-slice-<i>` of 1 per memory slice (as many as
  the largest placement spans);
- a partition consumes its profile's capacities and the memory slices of its placement; the
  whole GPU consumes the whole set, so it and any partition exclude each other, and partitions
  whose placements overlap exclude each other through the slices they share.

A GPU is partitionable when discovery read its profiles and its MIG mode is on, or it is Hopper
or later (whose MIG mode can be turned on without a reset). An Ampere GPU with MIG mode off is
published whole without counters, as NVIDIA's driver does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from deviceplugin.model.devices import Gpu, Inventory, MigProfile

MigMode = Literal["static", "dynamic"]
MIG_MODES: tuple[MigMode, ...] = ("static", "dynamic")
MIG_MODE_ENV = "DP_DRA_MIG_MODE"
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets, per slice
MAX_COUNTERS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet
_DNS_INVALID = re.compile(r"[^a-z0-9-]")
_HOPPER = 9  # compute capability major from which MIG mode changes without a reset

JsonObject = dict[str, Any]
Quantity = Callable[[int], str]


def mig_mode(value: str | None) -> MigMode:
    """`value` as a MIG mode (unset: static); ValueError naming the choices otherwise."""
    for mode in MIG_MODES:
        if (value or "static") == mode:
            return mode
    raise ValueError(f"must be {' or '.join(MIG_MODES)}, got {value!r}")


def partitionable(gpu: Gpu) -> bool:
    """Whether dynamic MIG publishes `gpu` as partitions: it has profiles with placements and
    MIG mode is on, or can be turned on at once (Hopper and later)."""
    if not gpu.mig_profiles:
        return False
    major = gpu.compute_capability.partition(".")[0]
    return gpu.mig_enabled or (major.isdigit() and int(major) >= _HOPPER)


def counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}-counter-set"


def partition_name(gpu: Gpu, profile: MigProfile, start: int) -> str:
    """NVIDIA's canonical name of a partition: `gpu-0-mig-1g10gb-19-0`."""
    label = _DNS_INVALID.sub("-", profile.name.replace(".", "").lower()).strip("-")
    return f"gpu-{gpu.minor}-mig-{label}-{profile.profile_id}-{start}"


def partitions(gpu: Gpu) -> list[tuple[MigProfile, int, int]]:
    """(profile, start, size) for each partition of `gpu`, in NVML's profile and placement
    order (the scheduler tries devices in slice order: small profiles first)."""
    return [(p, start, size) for p in gpu.mig_profiles for start, size in p.placements]


def capacities(profile: MigProfile) -> dict[str, int]:
    """A profile's capacities by NVIDIA's capacity names (memory in bytes)."""
    return {
        "multiprocessors": profile.multiprocessors,
        "copyEngines": profile.copy_engines,
        "decoders": profile.decoders,
        "encoders": profile.encoders,
        "jpegEngines": profile.jpegs,
        "ofaEngines": profile.ofas,
        "memory": profile.memory_mib << 20,
    }


def largest(gpu: Gpu) -> dict[str, int]:
    """The largest value of each capacity over the GPU's profiles: what the GPU holds."""
    found: dict[str, int] = {}
    for profile in gpu.mig_profiles:
        for name, value in capacities(profile).items():
            found[name] = max(found.get(name, 0), value)
    return found


def memory_slices(gpu: Gpu) -> int:
    """How many memory slices the GPU has: as many as its largest placement spans."""
    return max((size for p in gpu.mig_profiles for _, size in p.placements), default=0)


def counters(values: dict[str, int], start: int, size: int, quantity: Quantity) -> JsonObject:
    """`values` as counters (capacity names made DNS labels), plus `memory-slice-<i>` of 1 for
    the slices from `start` on."""
    found = {_counter_name(name): {"value": quantity(value)} for name, value in values.items()}
    found.update({f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)})
    return found


def counter_sets(inventory: Inventory, quantity: Quantity) -> list[JsonObject]:
    """One counter set per partitionable GPU, in GPU index order."""
    return [
        {"name": counter_set_name(gpu), "counters": _everything(gpu, quantity)}
        for gpu in sorted(inventory.gpus, key=lambda g: g.index)
        if partitionable(gpu)
    ]


def whole_consumes(gpu: Gpu, quantity: Quantity) -> list[JsonObject]:
    """What the whole GPU consumes: its entire counter set."""
    return [{"counterSet": counter_set_name(gpu), "counters": _everything(gpu, quantity)}]


def partition_consumes(
    gpu: Gpu, profile: MigProfile, start: int, size: int, quantity: Quantity
) -> list[JsonObject]:
    """What a partition consumes: its profile's capacities and its placement's memory slices."""
    used = counters(capacities(profile), start, size, quantity)
    return [{"counterSet": counter_set_name(gpu), "counters": used}]


def _everything(gpu: Gpu, quantity: Quantity) -> JsonObject:
    return counters(largest(gpu), 0, memory_slices(gpu), quantity)


def _counter_name(capacity: str) -> str:
    """NVIDIA's camelToDNSName: `copyEngines` -> `copy-engines`."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", capacity).lower()
