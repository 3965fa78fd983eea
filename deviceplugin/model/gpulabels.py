"""The node labels people select GPU nodes by, in GPU Feature Discovery's keys and formats.

A subset of GFD's labels, computed from the inventory and the config in force as GFD computes
them: `nvidia.com/gpu.product` is the GPU's name with characters other than letters, digits,
`-`, `_`, `.` dropped and blanks turned into `-`, with `-SHARED` when the resource is
time-sliced and not renamed; `gpu.memory` is MiB; `gpu.replicas` is 0 for MIG-enabled GPUs
(their sharing is not theirs to say), else the time-slicing replicas or 1; per MIG resource
`<resource>.count/.memory/.slices.gi/.slices.ci` (and `.product`, `.replicas`); the driver
version split into `cuda.driver-version.major/.minor/.revision`. `mig.strategy` is set only
with a MIG strategy, as GFD sets it.

`owned` says which keys are ours, so a writer removes a stale key of ours (a MIG profile
gone after a re-cut) and never touches anyone else's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from deviceplugin.model.config import Config, ReplicatedResource
from deviceplugin.model.devices import Gpu, Inventory, MigDevice
from deviceplugin.model.resources import GPU_RESOURCE, mig_resource_name

PREFIX = "nvidia.com/"
_OWNED = re.compile(
    r"nvidia\.com/(gpu\.(present|product|count|memory|family|compute\.major|compute\.minor"
    r"|replicas|sharing-strategy|slices\.gi|slices\.ci)"
    r"|mig\.(strategy|capable)"
    r"|mig-[^/]+\.(product|count|replicas|sharing-strategy|memory|slices\.gi|slices\.ci)"
    r"|cuda\.driver-version\.(major|minor|revision|full))"
)
_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")
# Compute capability major -> architecture family, as GFD names them (7.5+ turing, 8.9 ada).
_FAMILIES = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}


def owned(key: str) -> bool:
    """Whether `key` is one of the labels this module writes (for any hardware)."""
    return _OWNED.fullmatch(key) is not None


def gpu_labels(inventory: Inventory, config: Config) -> dict[str, str]:
    """The labels for this node's GPUs under `config`; empty when it has none."""
    if not inventory.gpus:
        return {}
    labels = {f"{PREFIX}gpu.present": "true"}
    labels.update(_driver_labels(inventory.driver_version))
    labels[f"{PREFIX}mig.capable"] = str(any(gpu.mig_capable for gpu in inventory.gpus)).lower()
    labels.update(_whole_gpu_labels(inventory.gpus, config))
    strategy = config.flags.mig_strategy
    if strategy == "none":
        return labels
    labels[f"{PREFIX}mig.strategy"] = strategy
    migs = [(gpu, mig) for gpu in inventory.gpus if gpu.mig_enabled for mig in gpu.mig_devices]
    if strategy == "single":
        labels.update(_single_labels(inventory.gpus, migs, config))
    else:
        profiles: dict[str, list[tuple[Gpu, MigDevice]]] = {}
        for gpu, mig in migs:
            profiles.setdefault(mig.profile, []).append((gpu, mig))
        for profile, found in profiles.items():
            gpu, mig = found[0]
            name = mig_resource_name(profile)
            labels.update(_resource_labels(name, config, len(found), gpu.name, "MIG", profile))
            labels.update(_mig_attributes(name, mig))
    return labels


def product_name(*parts: str) -> str:
    """GFD's product label value from name parts: unsafe characters dropped, blanks to `-`."""
    return "-".join("-".join(_UNSAFE.sub("", part).split()) for part in parts if part)


def family(major: int, minor: int) -> str:
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return _FAMILIES.get(major, "undefined")


def _driver_labels(version: str) -> dict[str, str]:
    parts = version.split(".")
    if not 2 <= len(parts) <= 3:
        return {}
    return {
        f"{PREFIX}cuda.driver-version.major": parts[0],
        f"{PREFIX}cuda.driver-version.minor": parts[1],
        f"{PREFIX}cuda.driver-version.revision": parts[2] if len(parts) == 3 else "",
        f"{PREFIX}cuda.driver-version.full": version,
    }


def _whole_gpu_labels(gpus: Iterable[Gpu], config: Config) -> dict[str, str]:
    """`nvidia.com/gpu.*` of one GPU model (the first by index, GPUs without MIG first, as
    GFD's whole GPUs override its MIG-enabled ones); its count is every GPU of that name."""
    ordered = sorted(gpus, key=lambda gpu: (gpu.mig_enabled, gpu.index))
    counts = Counter(gpu.name for gpu in ordered)
    gpu = ordered[0]
    sharing = None if gpu.mig_enabled else config
    labels = _resource_labels(GPU_RESOURCE, sharing, counts[gpu.name], gpu.name)
    if gpu.memory_mib:
        labels[f"{GPU_RESOURCE}.memory"] = str(gpu.memory_mib)
    major, _, minor = gpu.compute_capability.partition(".")
    if major.isdigit() and minor.isdigit() and int(major) > 0:
        labels[f"{GPU_RESOURCE}.family"] = family(int(major), int(minor))
        labels[f"{GPU_RESOURCE}.compute.major"] = major
        labels[f"{GPU_RESOURCE}.compute.minor"] = minor
    return labels


def _single_labels(
    gpus: Iterable[Gpu], migs: list[tuple[Gpu, MigDevice]], config: Config
) -> dict[str, str]:
    """Under `single`, MIG devices are `nvidia.com/gpu`: their labels replace the whole GPU's,
    or, for a layout `single` cannot serve, GFD's `-MIG-INVALID` product with zero counts."""
    enabled = [gpu for gpu in gpus if gpu.mig_enabled]
    if not enabled:
        return {}
    profiles = {mig.profile for _, mig in migs}
    empty = any(not gpu.mig_devices for gpu in enabled)
    if empty or len(enabled) != len(list(gpus)) or len(profiles) != 1:
        return {
            f"{GPU_RESOURCE}.product": product_name(enabled[0].name, "MIG", "INVALID"),
            f"{GPU_RESOURCE}.count": "0",
            f"{GPU_RESOURCE}.replicas": "0",
            f"{GPU_RESOURCE}.memory": "0",
        }
    gpu, mig = migs[0]
    labels = _resource_labels(GPU_RESOURCE, config, len(migs), gpu.name, "MIG", mig.profile)
    labels.update(_mig_attributes(GPU_RESOURCE, mig))
    return labels


def _resource_labels(
    resource: str, sharing: Config | None, count: int, *product: str
) -> dict[str, str]:
    """product, count, replicas and sharing-strategy of `resource`; `sharing` None: sharing
    is not decided for it (replicas 0)."""
    entry = _replicated(sharing, resource)
    replicas = 0 if sharing is None else (entry.replicas if entry is not None else 1)
    shared = entry is not None and entry.replicas > 1
    suffix = ("SHARED",) if shared and entry is not None and not entry.rename else ()
    return {
        f"{resource}.product": product_name(*product, *suffix),
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": "time-slicing" if shared else "none",
    }


def _mig_attributes(resource: str, mig: MigDevice) -> dict[str, str]:
    return {
        f"{resource}.memory": str(mig.memory_mib),
        f"{resource}.slices.gi": str(mig.gpu_slices),
        f"{resource}.slices.ci": str(mig.compute_slices),
    }


def _replicated(config: Config | None, resource: str) -> ReplicatedResource | None:
    slicing = config.sharing.time_slicing if config is not None else None
    if slicing is None:
        return None
    return next((entry for entry in slicing.resources if entry.name == resource), None)
