"""Inventory + Config -> the resources to advertise: {resource name: ResourceSet}.

Applies the MIG strategy (`none`, `single`, `mixed`, as the reference plugin does), then
time-slicing or MPS (replica IDs `<uuid>::<n>`, `rename`, `renameByDefault`, and — unlike the
reference — the `devices` selection, so dedicated and shared GPUs can sit side by side; MPS only
on whole GPUs, at most as many replicas as an MPS server takes clients), then health.
A rename, in whichever section, never lands on a name other devices already have: whole GPUs
and MIG devices, or two MIG profiles, are never merged into one resource by accident.
Pure functions: the same inputs always give the same, deterministically ordered, sets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import cached_property

from deviceplugin.model.config import Config, ReplicatedResource, ResourcePattern
from deviceplugin.model.devices import Device, Gpu, Health, Inventory, MigDevice, replica_id
from deviceplugin.model.errors import ConfigError, DiscoveryError
from deviceplugin.model.record import record

GPU_RESOURCE = "nvidia.com/gpu"
# Clients one MPS server takes per GPU: 48 from compute capability 7.5 (Volta MPS), else 16.
MPS_CLIENTS_VOLTA, MPS_CLIENTS_OLDER = 48, 16


@record(frozen=True)
class ResourceSet:
    """The devices advertised under one resource name, and the sharing rules for them."""

    name: str
    devices: tuple[Device, ...]
    replicas: int = 1  # > 1 when the devices are time-sliced or MPS replicas
    fail_requests_greater_than_one: bool = False
    mps: bool = False  # the replicas are shared through an MPS control daemon

    @property
    def shared(self) -> bool:
        return self.replicas > 1

    @property
    def socket_name(self) -> str:
        return socket_name(self.name)

    def by_id(self) -> Mapping[str, Device]:
        """The devices by ID, indexed once per set: Allocate looks IDs up on every call."""
        return self._index

    @cached_property
    def _index(self) -> dict[str, Device]:
        return {device.id: device for device in self.devices}

    @cached_property
    def healthy_count(self) -> int:
        return sum(device.healthy for device in self.devices)


@record(frozen=True)
class Plan:
    """The desired resource sets, plus warnings about what was skipped and why."""

    resources: Mapping[str, ResourceSet]
    warnings: tuple[str, ...] = ()


def socket_name(resource: str) -> str:
    """`nvidia.com/gpu` -> `nvidia-gpu.sock`, `nvidia.com/mig-1g.10gb` -> `nvidia-mig-1g.10gb.sock`.

    The domain's first label is the prefix, as the reference plugin names its sockets."""
    domain, _, name = resource.partition("/")
    return f"{domain.split('.')[0]}-{name}.sock"


def mig_resource_name(profile: str) -> str:
    """The mixed-strategy name of a MIG profile: `1g.10gb+me` -> `nvidia.com/mig-1g.10gb.me`."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def build_plan(inventory: Inventory, config: Config) -> Plan:
    """Apply MIG strategy, then time-slicing, to the inventory. Raises DiscoveryError when the
    MIG layout cannot be served with the chosen strategy, ConfigError when the sharing section
    contradicts the node."""
    warnings: list[str] = []
    strategy = config.flags.mig_strategy
    if strategy == "none":
        base = _strategy_none(inventory, config)
    elif strategy == "single":
        base = _strategy_single(inventory, config)
    else:
        base = _strategy_mixed(inventory, config, warnings)
    resources = _apply_sharing(base, inventory, config, warnings)
    return Plan(resources=resources, warnings=tuple(warnings))


def apply_health(
    resources: Mapping[str, ResourceSet], unhealthy: Mapping[str, str]
) -> dict[str, ResourceSet]:
    """Mark every device whose physical device or parent GPU is in `unhealthy` (UUID -> reason)."""
    result: dict[str, ResourceSet] = {}
    for name, resource_set in resources.items():
        devices = tuple(_with_health(device, unhealthy) for device in resource_set.devices)
        result[name] = replace(resource_set, devices=devices)
    return result


def _with_health(device: Device, unhealthy: Mapping[str, str]) -> Device:
    reason = unhealthy.get(device.physical_uuid) or unhealthy.get(device.gpu_uuid)
    if reason is None:
        return replace(device, health=Health.HEALTHY, reason="")
    return replace(device, health=Health.UNHEALTHY, reason=reason)


def _gpu_device(gpu: Gpu) -> Device:
    return Device(
        id=gpu.uuid,
        physical_uuid=gpu.uuid,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        gpu_minor=gpu.minor,
        numa_node=gpu.numa_node,
    )


def _mig_device(gpu: Gpu, mig: MigDevice) -> Device:
    return Device(
        id=mig.uuid,
        physical_uuid=mig.uuid,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        gpu_minor=gpu.minor,
        numa_node=gpu.numa_node,
        mig=mig,
    )


def _glob_match(pattern: str, value: str) -> bool:
    """Anchored glob where only `*` is special (the reference's rule since v0.20)."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, value) is not None


def _rename(patterns: Iterable[ResourcePattern], value: str, default: str) -> str:
    return _named(patterns, value, default)[0]


def _named(patterns: Iterable[ResourcePattern], value: str, default: str) -> tuple[str, int | None]:
    """The name for `value` and the position of the rule that gave it (None: the default)."""
    for position, rule in enumerate(patterns):
        if _glob_match(rule.pattern, value):
            return rule.name, position
    return default, None


@record(frozen=True)
class _Origin:
    """What put devices under a resource name: their kind and the rule that renamed them."""

    kind: str  # "whole GPUs", or "<profile> MIG devices"
    whole: bool
    field: str | None  # e.g. resources.mig[0].name; None for the default name


def _check_renames(origins: Mapping[str, list[_Origin]]) -> None:
    """A rename may share its name only with other renamed devices of the same family: never
    whole GPUs with MIG devices, never onto a name some devices have by default."""
    for name, kinds in origins.items():
        default = next((kind for kind in kinds if kind.field is None), None)
        other = default or kinds[0]
        renamer = next(
            (k for k in kinds if k is not other and (default or k.whole != other.whole)), None
        )
        if renamer is None:
            continue
        raise ConfigError(
            renamer.field or "resources",
            f"renames {renamer.kind} to {name}, the name the node's {other.kind} already have; "
            "a rename must not merge different kinds of devices into one resource",
        )


def _group(pairs: Iterable[tuple[str, Device]]) -> dict[str, list[Device]]:
    grouped: dict[str, list[Device]] = {}
    for name, device in pairs:
        grouped.setdefault(name, []).append(device)
    return grouped


def _strategy_none(inventory: Inventory, config: Config) -> dict[str, list[Device]]:
    renames = config.resources.gpus
    return _group(
        (_rename(renames, gpu.name, GPU_RESOURCE), _gpu_device(gpu)) for gpu in inventory.gpus
    )


def _strategy_single(inventory: Inventory, config: Config) -> dict[str, list[Device]]:
    enabled = [gpu for gpu in inventory.gpus if gpu.mig_enabled]
    if not enabled:
        return _strategy_none(inventory, config)
    disabled = [gpu for gpu in inventory.gpus if not gpu.mig_enabled]
    if disabled:
        names = ", ".join(f"GPU {gpu.index} ({gpu.uuid})" for gpu in disabled)
        raise DiscoveryError(
            f"migStrategy 'single' needs MIG enabled on every GPU or on none; "
            f"MIG is disabled on {names}; use migStrategy 'mixed'"
        )
    empty = [gpu for gpu in enabled if not gpu.mig_devices]
    if empty:
        names = ", ".join(f"GPU {gpu.index} ({gpu.uuid})" for gpu in empty)
        raise DiscoveryError(
            f"migStrategy 'single' needs the same MIG layout on every GPU; {names} has MIG "
            "enabled but no MIG devices; create its instances or use migStrategy 'mixed'"
        )
    profiles = {mig.profile for gpu in enabled for mig in gpu.mig_devices}
    if len(profiles) > 1:
        detail = "; ".join(
            f"GPU {gpu.index}: {', '.join(sorted({m.profile for m in gpu.mig_devices}))}"
            for gpu in enabled
        )
        raise DiscoveryError(
            "migStrategy 'single' needs every MIG device on the node to have the same profile; "
            f"found {', '.join(sorted(profiles))} ({detail}); use migStrategy 'mixed'"
        )
    renames = config.resources.mig
    return _group(
        (_rename(renames, mig.profile, GPU_RESOURCE), _mig_device(gpu, mig))
        for gpu in enabled
        for mig in gpu.mig_devices
    )


def _strategy_mixed(
    inventory: Inventory, config: Config, warnings: list[str]
) -> dict[str, list[Device]]:
    pairs: list[tuple[str, Device]] = []
    origins: dict[str, list[_Origin]] = {}

    def seen(name: str, kind: str, whole: bool, field: str, position: int | None) -> None:
        kinds = origins.setdefault(name, [])
        if all(origin.kind != kind for origin in kinds):
            rule = None if position is None else f"{field}[{position}].name"
            kinds.append(_Origin(kind, whole, rule))

    for gpu in inventory.gpus:
        if not gpu.mig_enabled:
            name, position = _named(config.resources.gpus, gpu.name, GPU_RESOURCE)
            seen(name, "whole GPUs", True, "resources.gpus", position)
            pairs.append((name, _gpu_device(gpu)))
            continue
        if not gpu.mig_devices:
            warnings.append(
                f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled but no MIG devices; skipped"
            )
        for mig in gpu.mig_devices:
            default = mig_resource_name(mig.profile)
            name, position = _named(config.resources.mig, mig.profile, default)
            if mig.compute_slices != mig.gpu_slices and name == default:
                warnings.append(
                    f"MIG device {mig.uuid} on GPU {gpu.index} has compute-instance profile "
                    f"{mig.profile}, which has no resource name; skipped"
                )
                continue
            seen(name, f"{mig.profile} MIG devices", False, "resources.mig", position)
            pairs.append((name, _mig_device(gpu, mig)))
    _check_renames(origins)
    return _group(pairs)


def _keys(device: Device) -> set[str]:
    """What a `devices:` entry may name a device by: its UUID or index (a GPU's own UUID too),
    and a MIG device by the legacy `MIG-<GPU uuid>/<gi>/<ci>` too."""
    keys = {device.physical_uuid, device.index_id}
    if device.mig is None:
        keys.add(device.gpu_uuid)
    else:
        mig = device.mig
        keys.add(f"MIG-{device.gpu_uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id}")
    return keys


def _apply_sharing(
    base: dict[str, list[Device]], inventory: Inventory, config: Config, warnings: list[str]
) -> dict[str, ResourceSet]:
    slicing, section = config.sharing.replicated
    mps = section == "sharing.mps"
    shared: dict[str, list[Device]] = {}
    replicas_of: dict[str, int] = {}
    dedicated = {name: list(devices) for name, devices in base.items()}
    origins: dict[str, str] = {}  # shared resource name -> the config field that named it
    # The config already refused two entries with one name or one advertised name.
    entries = (
        [(entry, slicing.advertised_name(entry)) for entry in slicing.resources] if slicing else []
    )
    for position, (entry, target) in enumerate(entries):
        path = f"{section}.resources[{position}]"
        if entry.name not in base:
            warnings.append(f"{path}: no device on this node backs {entry.name}; nothing shared")
            continue
        chosen, kept = _select(base[entry.name], entry, path, warnings)
        if kept and target == entry.name:
            raise ConfigError(
                f"{path}.devices",
                f"sharing only some devices of {entry.name} needs 'rename' (or renameByDefault), "
                "so shared and dedicated devices get different resource names",
            )
        if target in base and target != entry.name:
            raise ConfigError(f"{path}.rename", f"{target} is already a resource on this node")
        if mps:
            _check_mps(chosen, entry, inventory, path)
        origins[target] = f"{path}.rename" if entry.rename else f"{path}.name"
        dedicated[entry.name] = kept
        shared[target] = [
            replace(device, id=replica_id(device.physical_uuid, n), replica=n)
            for device in chosen
            for n in range(entry.replicas)
        ]
        replicas_of[target] = entry.replicas
    fail_gt_one = bool(slicing and slicing.fail_requests_greater_than_one)
    result: dict[str, ResourceSet] = {}
    for name, devices in dedicated.items():
        if devices:
            result[name] = ResourceSet(name=name, devices=_ordered(devices))
    for name, devices in shared.items():
        result[name] = ResourceSet(
            name=name,
            devices=_ordered(devices),
            replicas=replicas_of[name],
            fail_requests_greater_than_one=fail_gt_one,
            mps=mps,
        )
    _check_sockets(result, origins)
    return dict(sorted(result.items()))


def _check_mps(
    chosen: list[Device], entry: ReplicatedResource, inventory: Inventory, path: str
) -> None:
    """MPS shares whole GPUs only, each with at most as many replicas as its server takes."""
    mig = next((device for device in chosen if device.mig is not None), None)
    if mig is not None:
        raise ConfigError(
            f"{path}.name",
            f"sharing using MPS is not supported for MIG devices ({entry.name} holds {mig.id})",
        )
    for device in chosen:
        gpu = inventory.gpu(device.gpu_uuid)
        most = mps_clients(gpu.compute_capability if gpu else "")
        if entry.replicas > most:
            raise ConfigError(
                f"{path}.replicas",
                f"maximum allowed replicas exceeded: {entry.replicas} > {most}: an MPS server "
                f"on GPU {device.gpu_index} takes at most {most} clients",
            )


def mps_clients(compute_capability: str) -> int:
    """Clients an MPS server takes on a GPU of this compute capability ("8.0")."""
    major, _, minor = compute_capability.partition(".")
    try:
        volta = (int(major), int(minor or 0)) >= (7, 5)
    except ValueError:
        volta = False
    return MPS_CLIENTS_VOLTA if volta else MPS_CLIENTS_OLDER


def _check_sockets(resources: Mapping[str, ResourceSet], origins: Mapping[str, str]) -> None:
    """Two resources on one socket would silently replace each other at the kubelet."""
    owner: dict[str, str] = {}
    for name in sorted(resources, key=lambda n: (n in origins, n)):
        socket = socket_name(name)
        if socket in owner:
            raise ConfigError(
                origins.get(name, "resources"),
                f"{name} and {owner[socket]} would both be served on {socket}; "
                "choose names that differ after the domain's first label",
            )
        owner[socket] = name


def _select(
    devices: list[Device], entry: ReplicatedResource, path: str, warnings: list[str]
) -> tuple[list[Device], list[Device]]:
    if entry.devices == "all":
        return devices, []
    if isinstance(entry.devices, int):  # the first N, as the reference shares a count
        if entry.devices > len(devices):
            raise ConfigError(
                f"{path}.devices",
                f"asks to share {entry.devices} devices, but this node has only "
                f"{len(devices)} {entry.name} device{'s' if len(devices) != 1 else ''}",
            )
        ordered = list(_ordered(devices))
        return ordered[: entry.devices], ordered[entry.devices :]
    selectors = set(entry.devices)
    chosen: list[Device] = []
    kept: list[Device] = []
    known: set[str] = set()
    for device in devices:
        keys = _keys(device)
        (chosen if keys & selectors else kept).append(device)
        known |= keys
    for selector in entry.devices:
        if selector not in known:
            warnings.append(f"{path}.devices: {selector} matches no {entry.name} device; ignored")
    return chosen, kept


def _ordered(devices: Iterable[Device]) -> tuple[Device, ...]:
    def key(device: Device) -> tuple[int, int, int]:
        mig_index = device.mig.index if device.mig else -1
        return (device.gpu_index, mig_index, device.replica if device.replica is not None else -1)

    return tuple(sorted(devices, key=key))
