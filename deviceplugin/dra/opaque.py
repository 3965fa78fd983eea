"""Opaque device configuration: how a claim, or its DeviceClass, asks this driver to set up the
devices it was allocated, in a versioned API of this driver, validated with a field path.

An allocation carries `status.allocation.devices.config[]`: the class's entries
(`source: FromClass`), then the claim's (`FromClaim`), each for some requests (all of them when
`requests` is empty; a request `main` covers its subrequests `main/<sub>`), each
`opaque: {driver, parameters}`. Entries for other drivers are theirs. Ours read:

    apiVersion: deviceplugin.nvidia.com/v1alpha1    # this driver's API
    kind: GpuConfig                                 # a whole GPU; MigDeviceConfig: a MIG device
    sharing:                                        # optional: without it, nothing is shared
      strategy: TimeSlicing                         # or MPS
      timeSlicingConfig:                            # GpuConfig, TimeSlicing only
        interval: Default                           # Default, Short, Medium or Long
      mpsConfig:                                    # MPS only: the claim's client limits
        defaultActiveThreadPercentage: 50           # 1 to 100
        defaultPinnedDeviceMemoryLimit: 10Gi        # every device of the claim
        defaultPerDevicePinnedMemoryLimit: {"0": 8Gi}   # by index in the claim, or UUID

NVIDIA's DRA driver's `resource.nvidia.com/v1beta1` GpuConfig and MigDeviceConfig have this
shape, so parameters written for it are accepted as they are (`mpsdevices.py` runs the MPS
daemons, one per device, shared by its claims). Every entry of ours is validated, used or not,
so a typo is an error (`OpaqueConfigError`, whose path starts at
`status.allocation.devices.config[<i>]`), not a silently unshared GPU. A device takes the last
entry that covers its request, claim entries after class entries, so a claim overrides its
class; a GpuConfig that reaches a MIG device, or a MigDeviceConfig a GPU, is an error naming the
entry and the device.

How the settings take effect: they are recorded with the prepared claim (the checkpoint) and
handed to the container in its CDI device's environment (`device_env`), for the workload and
the tools that set the GPU's scheduler; the driver does not change the GPU's time slice itself.
MPS is set up by the driver: `mpsclient.py` turns the limits into the container's edits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from deviceplugin.dra.opaquebounds import (
    MAX_ENTRIES,
    check_count,
    check_parameters,
    check_requests,
)
from deviceplugin.dra.opaquetypes import MpsSettings, OpaqueConfigError
from deviceplugin.model.record import record

API_VERSION = "deviceplugin.nvidia.com/v1alpha1"
NVIDIA_API_VERSION = "resource.nvidia.com/v1beta1"  # NVIDIA's DRA driver's, accepted as well
API_VERSIONS = (API_VERSION, NVIDIA_API_VERSION)
CONFIG_PATH = "status.allocation.devices.config"
SOURCES = ("FromClass", "FromClaim")  # the order in which entries apply


@record(frozen=True)
class DeviceSettings:
    """How one allocated device is set up: shared by time-slicing, by MPS or not, with a GPU's
    time slice or the MPS limits; `origin` is the config entry that said so ("" for the
    default, exclusive)."""

    sharing: str = ""  # "TimeSlicing", "MPS", or "" for not shared
    interval: str = ""  # a GPU's time slice when time-sliced: Default, Short, Medium or Long
    origin: str = ""
    mps: MpsSettings | None = None  # with MPS


EXCLUSIVE = DeviceSettings()
KINDS = ("GpuConfig", "MigDeviceConfig")


@record(frozen=True)
class ConfigEntry:
    """One validated entry of this driver: where it is, whom it covers, what it says."""

    path: str  # status.allocation.devices.config[<i>]
    requests: tuple[str, ...]
    kind: str
    settings: DeviceSettings

    def covers(self, request: str) -> bool:
        return (
            not self.requests
            or request in self.requests
            or (request.partition("/")[0] in self.requests)
        )


def read_entries(devices: Mapping[str, Any], driver: str) -> list[ConfigEntry]:
    """This driver's entries of `allocation.devices`, validated, in the order they apply (class
    entries, then claim entries), within `opaquebounds`' limits. Raises OpaqueConfigError."""
    config = devices.get("config") or []
    if not isinstance(config, list):
        raise OpaqueConfigError(CONFIG_PATH, "must be a list of config entries")
    check_count(config, MAX_ENTRIES, CONFIG_PATH, "entries")
    found: list[tuple[int, int, ConfigEntry]] = []
    for index, entry in enumerate(config):
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        path = f"{CONFIG_PATH}[{index}]"
        source = entry.get("source")
        rank = SOURCES.index(source) if source in SOURCES else len(SOURCES)
        requests = check_requests(entry.get("requests"), f"{path}.requests")
        kind, settings = _parse(opaque.get("parameters"), f"{path}.opaque.parameters")
        found.append((rank, index, ConfigEntry(path, requests, kind, settings)))
    return [entry for _, _, entry in sorted(found, key=lambda item: item[:2])]


def settings_for(
    entries: Sequence[ConfigEntry], request: str, device: str, is_mig: bool
) -> DeviceSettings:
    """What the last entry covering `request` says for `device` (a MIG device when `is_mig`);
    EXCLUSIVE when none does. Raises OpaqueConfigError for an entry of the other kind."""
    chosen = next((e for e in reversed(entries) if e.covers(request)), None)
    if chosen is None:
        return EXCLUSIVE
    wanted = "MigDeviceConfig" if is_mig else "GpuConfig"
    if chosen.kind != wanted:
        what = "a MIG device" if is_mig else "a whole GPU"
        raise OpaqueConfigError(
            f"{chosen.path}.opaque.parameters.kind",
            f"{chosen.kind} does not apply to {device} (request {request!r}), {what}; use {wanted}",
        )
    return chosen.settings


def _parse(parameters: object, path: str) -> tuple[str, DeviceSettings]:
    check_parameters(parameters, path)
    if not isinstance(parameters, Mapping):
        raise OpaqueConfigError(
            path, f"must be a mapping with apiVersion and kind, got {parameters!r}"
        )
    version = parameters.get("apiVersion")
    if version not in API_VERSIONS:
        raise OpaqueConfigError(
            f"{path}.apiVersion",
            f"must be {API_VERSION} (or NVIDIA's {NVIDIA_API_VERSION}), got {version!r}",
        )
    kind = parameters.get("kind")
    if kind not in KINDS:
        raise OpaqueConfigError(
            f"{path}.kind", f"must be GpuConfig or MigDeviceConfig, got {kind!r}"
        )
    # pydantic and the models load with the first claim that carries parameters of ours
    from deviceplugin.dra.opaqueschema import sharing_of

    strategy, interval, mps = sharing_of(kind, parameters, path)
    origin = path.removesuffix(".opaque.parameters")
    return kind, DeviceSettings(strategy, interval, origin, mps)


def device_env(device: str, settings: DeviceSettings, admin: bool, share: str) -> list[str]:
    """The environment that comes with `device` in its CDI device: `DRA_<DEVICE>_` followed by
    SHARING_STRATEGY, TIMESLICE_INTERVAL, ADMIN_ACCESS (`true`) and SHARE_ID, each only when set;
    `<DEVICE>` is the device name upper-cased, other characters as `_` (`gpu-0-mig-7-0` ->
    `GPU_0_MIG_7_0`), so the variables of several devices in one container do not collide."""
    prefix = "DRA_" + re.sub(r"[^A-Z0-9]", "_", device.upper())
    values = {
        "SHARING_STRATEGY": settings.sharing,
        "TIMESLICE_INTERVAL": settings.interval,
        "ADMIN_ACCESS": "true" if admin else "",
        "SHARE_ID": share,
    }
    return [f"{prefix}_{name}={value}" for name, value in values.items() if value]
