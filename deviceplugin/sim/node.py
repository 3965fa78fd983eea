"""A simulated node: the YAML of SPEC section 3 (a file or a built-in preset) as frozen values.

Besides the fields SPEC section 3 fixes, a GPU entry may carry (all optional):

    nvswitchLinks: 12          active NVLinks that end on an NVSwitch (their remote device type
                               is SWITCH and their remote PCI bus id the switch's); they follow the
                               `nvlinkPeers` links. Every pair of GPUs that both have such links is
                               NVLink-connected through the switch fabric, as on DGX/HGX boards.
    hostBridge: hb0            PCIe host bridge id; GPUs under the same one are HOSTBRIDGE apart
    pcieSwitches: [sw0, sw0a]  PCIe switches above the GPU, outermost first: the same innermost
                               switch is SINGLE, a shared outer switch only is MULTIPLE
    supportedEvents: 0x8       nvmlDeviceGetSupportedEventTypes (default: Xid, ECC, PState, clock)
    notSupported: [nvmlDeviceGetRemappedRows]   NVML functions that answer NOT_SUPPORTED here

and a MIG device entry may carry `memoryMiB` (override the size its profile implies, to model
another driver release). Without pcieSwitches/hostBridge two GPUs are NODE apart on the same
NUMA node and SYSTEM apart otherwise. A file that breaks these rules raises ConfigError naming
the field, e.g. `gpus[2].migDevices[0].profile`.

The limits are those of the simulated C library (`native/sim.h`, NVML's buffer sizes), so a
node `sim-root` accepts is one its library serves: at most 64 GPUs and 36 NVLinks each, names
and UUIDs that fit NVML's 96-byte buffers, integers in the range the library stores, unique
indexes, UUIDs, minors and PCI addresses, and MIG devices that fit their GPU (see `_placed`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deviceplugin.model.config_keys import read_untrusted
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.record import record
from deviceplugin.node.regularfile import read_regular
from deviceplugin.sim.profiles import (
    GiProfile,
    MigShape,
    gpu_slices,
    model_profiles,
    place_instances,
    resolve,
)

PRESETS_DIR = Path(__file__).parent / "presets"
DEFAULT_SUPPORTED_EVENTS = 0x1 | 0x2 | 0x4 | 0x8 | 0x10
MAX_NODE_BYTES = 1024 * 1024
MAX_GPUS = 64  # SIM_MAX_GPUS
MAX_MIGS = 64  # SIM_MAX_MIGS; placement allows far fewer
MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS
NAME_BYTES = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE
MAX_STRING = 256
MAX_MEMORY_MIB = 1 << 40
MAX_MINOR = 253  # /dev/nvidia254 and 255 are the driver's modeset and control nodes
MAX_NUMA_NODE = 4096
MAX_GPU_INSTANCE_ID = 14  # the driver's table: 15 GPU instances of 8 compute instances
MAX_COMPUTE_INSTANCE_ID = 7
INT32_MAX = (1 << 31) - 1
INT63_MAX = (1 << 63) - 1
_UUID = re.compile(r"[!-~]{1,95}")  # printable ASCII, no blank: what NVML hands out
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+~-]{0,63}")  # it names files under DIR
_BUS_ID = re.compile(r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-7]")
_CAPABILITY = re.compile(r"([0-9]{1,2})\.([0-9]{1,2})")
_CALL = re.compile(r"nvml[A-Za-z0-9_]{1,120}")
_ANY = re.compile(r"[^\0]{1,256}")


@record(frozen=True)
class SimMig:
    """One MIG device: its identity and the NVML attributes its profile implies."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    shape: MigShape
    profile: str
    placement: tuple[int, int]  # its GPU instance's (start, size) in memory slices


@record(frozen=True)
class SimGpu:
    """One simulated GPU."""

    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    index: int
    minor: int
    numa_node: int | None
    compute_capability: tuple[int, int]
    mig_capable: bool
    mig_enabled: bool
    mig_devices: tuple[SimMig, ...]
    nvlink_peers: tuple[int, ...]
    nvswitch_links: int
    host_bridge: str | None
    pcie_switches: tuple[str, ...]
    supported_events: int
    not_supported: frozenset[str]


@record(frozen=True)
class Node:
    """Everything NVML would report on one machine."""

    driver_version: str
    cuda_driver_version: int
    gpus: tuple[SimGpu, ...]


def preset_names() -> list[str]:
    """The built-in presets, usable as `--simulate NAME`."""
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def resolve_node_path(source: str) -> Path:
    """A node file path from `--simulate`: an existing file, else a preset name."""
    path = Path(source)
    if os.path.lexists(path):  # whatever it is: the reader says why it is no node file
        return path
    preset = PRESETS_DIR / f"{source}.yaml"
    if preset.is_file():
        return preset
    raise ConfigError(
        "simulate", f"{source!r} is neither a file nor a preset ({', '.join(preset_names())})"
    )


def read_node(path: Path) -> Node:
    """Read, parse and check one node file: the one reader of node files for every command."""
    return parse_node(read_node_document(path))


def read_node_document(path: Path) -> object:
    """A node file's document: a regular file of at most MAX_NODE_BYTES, UTF-8, YAML or JSON
    with unique keys and bounded nesting and alias expansion (the config file's limits)."""
    try:
        raw = read_regular(str(path), MAX_NODE_BYTES)
    except (OSError, ValueError) as err:
        raise ConfigError("simulate", f"cannot read node file {path}: {err}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError("simulate", f"node file {path} is not UTF-8 text: {err}") from None
    return read_untrusted(text, f"node file {path}")


# The node file this process read last: its path, its stamp before that read, and the Node.
_LAST_READ: dict[Path, tuple[tuple[int, ...], Node]] = {}


def node_file_stamp(path: Path) -> tuple[int, ...]:
    """What changes when the file is rewritten or replaced; () when it cannot be read."""
    try:
        stat = path.stat()
    except OSError:
        return ()
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def read_node_once(path: Path) -> Node:
    """`read_node(path)`, or the Node this process last read from `path` when the file is
    unchanged since (same inode, size and times): `serve --simulate` reads its node for the
    host files and again for the simulated NVML, a few milliseconds apart."""
    stamp = node_file_stamp(path)
    last = _LAST_READ.get(path)
    if last is not None and stamp and last[0] == stamp:
        return last[1]
    node = read_node(path)
    _LAST_READ.clear()
    _LAST_READ[path] = (stamp, node)
    return node


def parse_node(data: object) -> Node:
    """Check a parsed node document and build the Node it describes."""
    top = _mapping(data, "")
    entries = _list(top, "gpus", "", MAX_GPUS)
    gpus = tuple(
        _gpu(_mapping(entry, f"gpus[{i}]"), i, len(entries)) for i, entry in enumerate(entries)
    )
    _check_unique(gpus)
    return Node(
        driver_version=_driver_version(top),
        cuda_driver_version=_int(top, "cudaDriverVersion", "", 12040, INT32_MAX),
        gpus=tuple(sorted(gpus, key=lambda gpu: gpu.index)),
    )


def _gpu(data: Mapping[str, Any], position: int, count: int) -> SimGpu:
    path = f"gpus[{position}]"
    uuid = _str(data, "uuid", path, prefix="GPU-", pattern=_UUID)
    name = _str(data, "name", path)
    if len(name.encode()) >= NAME_BYTES:
        raise ConfigError(f"{path}.name", f"must be shorter than {NAME_BYTES} bytes")
    memory_mib = _int(data, "memoryMiB", path, None, MAX_MEMORY_MIB)
    index = _int(data, "index", path, position, max(count - 1, 0))
    mig_enabled = _bool(data, "migEnabled", path, False)
    mig_capable = _bool(data, "migCapable", path, mig_enabled)
    if mig_enabled and not mig_capable:
        raise ConfigError(f"{path}.migEnabled", "MIG cannot be enabled when migCapable is false")
    entries = _list(data, "migDevices", path, MAX_MIGS)
    if entries and not mig_enabled:
        raise ConfigError(f"{path}.migDevices", "MIG devices need migEnabled: true")
    peers = _int_list(data, "nvlinkPeers", path, MAX_NVLINKS)
    for link, peer in enumerate(peers):
        if not 0 <= peer < count or peer == index:
            raise ConfigError(f"{path}.nvlinkPeers[{link}]", f"{peer} is not another GPU's index")
    switch_links = _int(data, "nvswitchLinks", path, 0, MAX_NVLINKS - len(peers))
    numa = data.get("numaNode")
    if numa is not None:
        numa = _int(data, "numaNode", path, None, MAX_NUMA_NODE)
    migs = [
        _mig(_mapping(entry, f"{path}.migDevices[{i}]"), f"{path}.migDevices[{i}]", i, name)
        for i, entry in enumerate(entries)
    ]
    return SimGpu(
        uuid=uuid,
        name=name,
        memory_mib=memory_mib,
        pci_bus_id=_bus_id(data, path, index),
        index=index,
        minor=_int(data, "minor", path, index, MAX_MINOR),
        numa_node=numa,
        compute_capability=_capability(data, path),
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=_placed(migs, name, memory_mib, f"{path}.migDevices"),
        nvlink_peers=tuple(peers),
        nvswitch_links=switch_links,
        host_bridge=_optional_str(data, "hostBridge", path),
        pcie_switches=tuple(_str_list(data, "pcieSwitches", path, 16)),
        supported_events=_int(data, "supportedEvents", path, DEFAULT_SUPPORTED_EVENTS, INT63_MAX),
        not_supported=frozenset(_str_list(data, "notSupported", path, 1024, _CALL)),
    )


@record(frozen=True)
class _MigEntry:
    """A MIG device entry checked on its own, before its GPU places it."""

    data: Mapping[str, Any]
    path: str
    uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int


def _mig(data: Mapping[str, Any], path: str, position: int, gpu_name: str) -> _MigEntry:
    profile = _str(data, "profile", path)
    entry = _MigEntry(
        data=data,
        path=path,
        uuid=_str(data, "uuid", path, prefix="MIG-", pattern=_UUID),
        profile=profile,
        gpu_instance_id=_int(data, "gpuInstanceId", path, position + 1, MAX_GPU_INSTANCE_ID),
        compute_instance_id=_int(data, "computeInstanceId", path, 0, MAX_COMPUTE_INSTANCE_ID),
    )
    if len(f"{gpu_name} MIG {profile}".encode()) >= NAME_BYTES:
        raise ConfigError(f"{path}.profile", f"the MIG device's name is {NAME_BYTES} bytes or more")
    return entry


def _placed(
    entries: list[_MigEntry], gpu_name: str, total_mib: int, path: str
) -> tuple[SimMig, ...]:
    """The MIG devices with their shapes, each GPU instance placed as the driver would: MIG
    devices that share a GPU instance share its profile and split its compute slices; the GPU
    instances of a GPU do not overlap (hence at most as many of a profile as it has places)."""
    shapes = []
    for entry in entries:
        memory = entry.data.get("memoryMiB")
        if memory is not None:
            memory = _int(entry.data, "memoryMiB", entry.path, None, MAX_MEMORY_MIB)
        try:
            shapes.append(resolve(gpu_name, total_mib, entry.profile, memory))
        except ValueError as err:
            raise ConfigError(f"{entry.path}.profile", str(err)) from err
    instances: dict[int, GiProfile] = {}
    used: dict[int, int] = {}
    for entry, shape in zip(entries, shapes, strict=True):
        gi = instances.setdefault(entry.gpu_instance_id, shape.gpu_instance)
        if gi != shape.gpu_instance:
            raise ConfigError(
                f"{entry.path}.profile",
                f"GPU instance {entry.gpu_instance_id} has another profile on this GPU",
            )
        used[entry.gpu_instance_id] = used.get(entry.gpu_instance_id, 0) + shape.compute_slices
        if used[entry.gpu_instance_id] > gi.slices:
            raise ConfigError(
                f"{entry.path}.profile",
                f"the compute instances of GPU instance {entry.gpu_instance_id} need more than "
                f"its {gi.slices} slices",
            )
    offered = model_profiles(gpu_name)
    for entry, shape in zip(entries, shapes, strict=True):
        gi = offered.setdefault(shape.gpu_instance.enum, shape.gpu_instance)
        if (gi.id, gi.slices) != (shape.gpu_instance.id, shape.gpu_instance.slices):
            raise ConfigError(
                f"{entry.path}.profile", f"{gpu_name} offers no GPU-instance profile like it"
            )
    spots = place_instances(list(instances.values()), gpu_slices(offered))
    if spots is None:
        raise ConfigError(
            path,
            f"its {len(instances)} GPU instances do not fit the GPU together (each needs a "
            "placement of its profile that overlaps no other's)",
        )
    placed = dict(zip(instances, spots, strict=True))
    migs = [
        SimMig(
            uuid=entry.uuid,
            gpu_instance_id=entry.gpu_instance_id,
            compute_instance_id=entry.compute_instance_id,
            shape=shape,
            profile=entry.profile,
            placement=placed[entry.gpu_instance_id],
        )
        for entry, shape in zip(entries, shapes, strict=True)
    ]
    return tuple(migs)


def _check_unique(gpus: tuple[SimGpu, ...]) -> None:
    seen: set[str] = set()
    minors: set[int] = set()
    for position, gpu in enumerate(gpus):
        for uuid in (gpu.uuid, *(mig.uuid for mig in gpu.mig_devices)):
            if uuid in seen:
                raise ConfigError(f"gpus[{position}]", f"UUID {uuid} appears more than once")
            seen.add(uuid)
        if gpu.minor in minors:
            raise ConfigError(f"gpus[{position}].minor", f"{gpu.minor} is another GPU's minor")
        minors.add(gpu.minor)
        instances = [(mig.gpu_instance_id, mig.compute_instance_id) for mig in gpu.mig_devices]
        if len(set(instances)) != len(instances):
            raise ConfigError(f"gpus[{position}].migDevices", "two MIG devices share GI/CI ids")
    indices = sorted(gpu.index for gpu in gpus)
    if indices != list(range(len(gpus))):
        raise ConfigError("gpus", f"GPU indices must be 0..{len(gpus) - 1}, each once")
    buses = [gpu.pci_bus_id.lower() for gpu in gpus]
    if len(set(buses)) != len(buses):
        raise ConfigError("gpus", "two GPUs share a pciBusId")


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(path, "must be a mapping")
    return value


def _str(
    data: Mapping[str, Any],
    key: str,
    path: str,
    prefix: str = "",
    pattern: re.Pattern[str] | None = None,
) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.startswith(prefix) or value == prefix:
        expected = f"a string starting with {prefix!r}" if prefix else "a non-empty string"
        raise ConfigError(f"{path}.{key}", f"must be {expected}")
    if "\0" in value or len(value) > MAX_STRING:
        raise ConfigError(f"{path}.{key}", f"must hold no NUL and at most {MAX_STRING} characters")
    if pattern is not None and not pattern.fullmatch(value):
        raise ConfigError(f"{path}.{key}", f"must match {pattern.pattern}")
    return value


def _optional_str(data: Mapping[str, Any], key: str, path: str) -> str | None:
    return None if data.get(key) is None else _str(data, key, path)


def _int(data: Mapping[str, Any], key: str, path: str, default: int | None, largest: int) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= largest:
        raise ConfigError(f"{path}.{key}".lstrip("."), f"must be an integer from 0 to {largest}")
    return value


def _bool(data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{path}.{key}", "must be true or false")
    return value


def _list(data: Mapping[str, Any], key: str, path: str, longest: int) -> list[Any]:
    where = f"{path}.{key}".lstrip(".")
    value = data.get(key) or []
    if not isinstance(value, list):
        raise ConfigError(where, "must be a list")
    if len(value) > longest:
        raise ConfigError(where, f"has {len(value)} entries; at most {longest}")
    return value


def _int_list(data: Mapping[str, Any], key: str, path: str, longest: int) -> list[int]:
    values = _list(data, key, path, longest)
    for position, value in enumerate(values):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{path}.{key}[{position}]", "must be an integer")
    return values


def _str_list(
    data: Mapping[str, Any], key: str, path: str, longest: int, pattern: re.Pattern[str] = _ANY
) -> list[str]:
    values = _list(data, key, path, longest)
    for position, value in enumerate(values):
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise ConfigError(f"{path}.{key}[{position}]", "must be a string")
        if not pattern.fullmatch(str(value)):
            raise ConfigError(f"{path}.{key}[{position}]", f"must match {pattern.pattern}")
    return [str(value) for value in values]


def _driver_version(top: Mapping[str, Any]) -> str:
    value = top.get("driverVersion", "550.90.07")
    text = "" if isinstance(value, bool) or not isinstance(value, str | int | float) else str(value)
    if not _VERSION.fullmatch(text):
        raise ConfigError("driverVersion", f"must match {_VERSION.pattern}")
    return text


def _bus_id(data: Mapping[str, Any], path: str, index: int) -> str:
    value = data.get("pciBusId", f"00000000:{0x10 + index:02X}:00.0")
    if not isinstance(value, str) or not _BUS_ID.fullmatch(value):
        raise ConfigError(f"{path}.pciBusId", "must look like 00000000:07:00.0")
    return value


def _capability(data: Mapping[str, Any], path: str) -> tuple[int, int]:
    value = str(data.get("computeCapability", "8.0"))
    match = _CAPABILITY.fullmatch(value)
    if match is None:
        raise ConfigError(f"{path}.computeCapability", "must look like 8.0")
    return int(match.group(1)), int(match.group(2))
