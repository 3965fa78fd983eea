"""The CDI spec that defines every name Allocate hands out, built from the inventory.

A CDI strategy (`cdi-cri`, `cdi-annotations`) answers Allocate with names such as
`k8s.device-plugin.nvidia.com/gpu=<id>`; the container runtime resolves them from a spec file on
the host. This module turns the inventory, a `HostScan` (what `deviceplugin.node.hostscan` found
on the host) and `CdiOptions` into that spec as a JSON-ready dict, and nothing else: no I/O, so
it is tested on plain values and called per claim by other front-ends (`device_edits`,
`common_edits`, `minimum_cdi_version`).

Every `hostPath` is a host path (under the driver root or dev root of the options): the runtime
reads the spec on the host, whatever root this process sees the driver under. Device nodes carry
their type and major:minor, so the runtime can create a MIG capability node inside the container
even where the host has not created it yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any

from deviceplugin.model.allocation import CDI_KIND, VOLUME_MOUNTS_ROOT, IdStrategy
from deviceplugin.model.config import Config
from deviceplugin.model.devices import Gpu, Inventory, MigDevice
from deviceplugin.model.errors import DevicePluginError
from deviceplugin.model.hostpaths import (
    capability_node,
    compute_instance_key,
    gpu_instance_key,
    host_path,
)
from deviceplugin.model.record import record

NVIDIA_MAJOR = 195  # /dev/nvidia<minor>, /dev/nvidiactl: fixed by the driver
ALL_DEVICES = "all"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"  # a legacy NVIDIA runtime injects nothing
# The same opt-out for a legacy runtime that reads device lists from volume mounts
# (accept-nvidia-visible-devices-as-volume-mounts): /dev/null mounted as the list entry `void`.
VOLUME_MOUNT_VOID = f"{VOLUME_MOUNTS_ROOT}/void"
VOID_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
# The oldest version a runtime accepts, then the versions that introduced each feature we test
# for. Emitting only the minimum keeps older runtimes (podman 4.3 skips >= 0.6.0) working.
OLDEST_VERSION = "0.3.0"
VALID_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


class CdiError(DevicePluginError):
    """The spec cannot be built for this inventory (e.g. a MIG device's mig-minors entry is
    missing); the message names the device and what is missing."""


@record(frozen=True)
class NodeFile:
    """A character device node found on the host: its path as a container sees it
    (`/dev/nvidiactl`) and its major:minor, or None for both where the file is not a character
    device (a simulated host laid out without root)."""

    path: str
    major: int | None = None
    minor: int | None = None


@record(frozen=True)
class HostScan:
    """What the host has, as plain values: control nodes that exist, the character-device
    majors of `/proc/devices` by name, the driver's mig-minors table, and the driver's files
    found under the driver root (absolute paths as a container sees them)."""

    driver_version: str = ""
    control_nodes: tuple[NodeFile, ...] = ()
    majors: Mapping[str, int] = field(default_factory=dict)
    mig_minors: Mapping[str, int] = field(default_factory=dict)
    libraries: tuple[str, ...] = ()
    binaries: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()
    simulation: tuple[str, ...] = ()  # a simulated driver root's own files (hostscan.py)


@record(frozen=True)
class CdiOptions:
    """What shapes the spec: how devices are named, and the host roots of the driver's files
    (`driver_root`) and device nodes (`dev_root`)."""

    id_strategy: IdStrategy = "uuid"
    driver_root: str = "/"
    dev_root: str = "/"
    kind: str = CDI_KIND

    @classmethod
    def from_config(cls, config: Config) -> CdiOptions:
        flags = config.flags
        return cls(
            id_strategy=flags.plugin.device_id_strategy,
            driver_root=flags.nvidia_driver_root,
            dev_root=flags.dev_root,
        )


def device_name(gpu: Gpu, mig: MigDevice | None, strategy: IdStrategy) -> str:
    """The CDI device name Allocate hands out for this GPU (or MIG device of it)."""
    if strategy == "uuid":
        return gpu.uuid if mig is None else mig.uuid
    return str(gpu.index) if mig is None else f"{gpu.index}:{mig.index}"


def device_edits(
    gpu: Gpu, mig: MigDevice | None, scan: HostScan, options: CdiOptions
) -> dict[str, Any]:
    """The containerEdits of one GPU (`mig` None) or one MIG device of it: the GPU's node, and
    for a MIG device also its GPU-instance and compute-instance access nodes. Raises CdiError
    when the mig-minors table lacks an entry the MIG device needs."""
    nodes = [_gpu_node(gpu, scan, options)]
    if mig is not None:
        nodes.extend(_capability_nodes(gpu, mig, scan, options))
    return {"deviceNodes": nodes}


def common_edits(scan: HostScan, options: CdiOptions) -> dict[str, Any]:
    """The containerEdits applied once whenever any device is injected: the legacy runtime's
    opt-outs (a variable and a volume mount), the control nodes that exist, and read-only
    mounts of the driver's libraries, binaries and firmware (and of a simulated driver's node
    and state, which its library reads in the container as a real one reads the kernel's)."""
    edits: dict[str, Any] = {"env": [VISIBLE_DEVICES_VOID]}
    nodes = [
        _node(node.path, options.dev_root, node.major, node.minor) for node in scan.control_nodes
    ]
    if nodes:
        edits["deviceNodes"] = nodes
    files = (*scan.libraries, *scan.binaries, *scan.firmware, *scan.simulation)
    edits["mounts"] = [
        *(
            {
                "hostPath": host_path(options.driver_root, path),
                "containerPath": path,
                "options": list(MOUNT_OPTIONS),
            }
            for path in files
        ),
        {
            "hostPath": "/dev/null",
            "containerPath": VOLUME_MOUNT_VOID,
            "options": list(VOID_MOUNT_OPTIONS),
        },
    ]
    return edits


def build_spec(inventory: Inventory, scan: HostScan, options: CdiOptions) -> dict[str, Any]:
    """The whole spec: one device per GPU and per MIG device under its Allocate name, a device
    `all` with every node, and the common edits, at the minimum version they need."""
    devices = []
    every_node: dict[str, dict[str, Any]] = {}
    for gpu in inventory.gpus:
        for mig in (None, *gpu.mig_devices):
            edits = device_edits(gpu, mig, scan, options)
            for node in edits["deviceNodes"]:
                every_node.setdefault(node["path"], node)
            devices.append(
                {"name": device_name(gpu, mig, options.id_strategy), "containerEdits": edits}
            )
    if devices:
        devices.append(
            {"name": ALL_DEVICES, "containerEdits": {"deviceNodes": list(every_node.values())}}
        )
    spec: dict[str, Any] = {
        "cdiVersion": OLDEST_VERSION,
        "kind": options.kind,
        "devices": devices,
        "containerEdits": common_edits(scan, options),
    }
    spec["cdiVersion"] = minimum_cdi_version(spec)
    return spec


def minimum_cdi_version(spec: Mapping[str, Any]) -> str:
    """The oldest CDI version that has every feature `spec` uses: `hostPath` on a device node
    0.5.0, a mount `type` 0.4.0, annotations 0.6.0, `additionalGids` / `intelRdt` 0.7.0,
    `netDevices` 1.1.0; 0.3.0 otherwise. Runtimes skip a spec whose version they do not know,
    so the newest is not the safest."""
    needed = [OLDEST_VERSION]
    if spec.get("annotations"):
        needed.append("0.6.0")
    for device in spec.get("devices", ()):
        if device.get("annotations"):
            needed.append("0.6.0")
        needed.extend(_edits_versions(device.get("containerEdits", {})))
    needed.extend(_edits_versions(spec.get("containerEdits", {})))
    return max(needed, key=VALID_VERSIONS.index)


def _edits_versions(edits: Mapping[str, Any]) -> Iterable[str]:
    if any("hostPath" in node for node in edits.get("deviceNodes", ())):
        yield "0.5.0"
    if any("type" in mount for mount in edits.get("mounts", ())):
        yield "0.4.0"
    if edits.get("additionalGids") or edits.get("intelRdt"):
        yield "0.7.0"
    if edits.get("netDevices"):
        yield "1.1.0"


def _node(path: str, root: str, major: int | None, minor: int | None) -> dict[str, Any]:
    node: dict[str, Any] = {"path": path, "hostPath": host_path(root, path)}
    if major is not None and minor is not None:
        node.update(type="c", major=major, minor=minor)
    return node


def _gpu_node(gpu: Gpu, scan: HostScan, options: CdiOptions) -> dict[str, Any]:
    major = scan.majors.get("nvidia-frontend", scan.majors.get("nvidia", NVIDIA_MAJOR))
    return _node(f"/dev/nvidia{gpu.minor}", options.dev_root, major, gpu.minor)


def _capability_nodes(
    gpu: Gpu, mig: MigDevice, scan: HostScan, options: CdiOptions
) -> Sequence[dict[str, Any]]:
    """The GPU-instance and compute-instance access nodes; the table names the parent by its
    minor number. Without an `nvidia-caps` major the runtime reads it from the host node."""
    keys = (
        ("GPU instance", gpu_instance_key(gpu.minor, mig.gpu_instance_id)),
        (
            "compute instance",
            compute_instance_key(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id),
        ),
    )
    major = scan.majors.get("nvidia-caps")
    nodes = []
    for capability, key in keys:
        minor = scan.mig_minors.get(key)
        if minor is None:
            raise CdiError(
                f"MIG device {mig.uuid} ({gpu.index}:{mig.index}): no {capability} access "
                f"capability '{key}' in the driver's mig-minors table"
            )
        nodes.append(_node(capability_node(minor), options.dev_root, major, minor))
    return nodes
