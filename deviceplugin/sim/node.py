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
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deviceplugin.model.errors import ConfigError
from deviceplugin.model.record import record
from deviceplugin.model.yamlimport import yaml
from deviceplugin.sim.profiles import MigShape, resolve

PRESETS_DIR = Path(__file__).parent / "presets"
DEFAULT_SUPPORTED_EVENTS = 0x1 | 0x2 | 0x4 | 0x8 | 0x10


@record(frozen=True)
class SimMig:
    """One MIG device: its identity and the NVML attributes its profile implies."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    shape: MigShape
    profile: str


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
    if path.is_file():
        return path
    preset = PRESETS_DIR / f"{source}.yaml"
    if preset.is_file():
        return preset
    raise ConfigError(
        "simulate", f"{source!r} is neither a file nor a preset ({', '.join(preset_names())})"
    )


def read_node(path: Path) -> Node:
    """Parse and check one node file."""
    try:
        # libyaml's loader where built in: about 7 times faster on a preset, read at each start
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError("simulate", f"cannot read node file {path}: {err}") from err
    return parse_node(data)


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
    entries = top.get("gpus") or []
    if not isinstance(entries, list):
        raise ConfigError("gpus", "must be a list")
    gpus = tuple(
        _gpu(_mapping(entry, f"gpus[{i}]"), i, len(entries)) for i, entry in enumerate(entries)
    )
    _check_unique(gpus)
    return Node(
        driver_version=str(top.get("driverVersion", "550.90.07")),
        cuda_driver_version=_int(top, "cudaDriverVersion", "", 12040),
        gpus=tuple(sorted(gpus, key=lambda gpu: gpu.index)),
    )


def _gpu(data: Mapping[str, Any], position: int, count: int) -> SimGpu:
    path = f"gpus[{position}]"
    uuid = _str(data, "uuid", path, prefix="GPU-")
    name = _str(data, "name", path)
    memory_mib = _int(data, "memoryMiB", path, None)
    index = _int(data, "index", path, position)
    if not 0 <= index < count:
        raise ConfigError(f"{path}.index", f"must be between 0 and {count - 1}")
    mig_enabled = _bool(data, "migEnabled", path, False)
    mig_capable = _bool(data, "migCapable", path, mig_enabled)
    if mig_enabled and not mig_capable:
        raise ConfigError(f"{path}.migEnabled", "MIG cannot be enabled when migCapable is false")
    migs = data.get("migDevices") or []
    if not isinstance(migs, list):
        raise ConfigError(f"{path}.migDevices", "must be a list")
    if migs and not mig_enabled:
        raise ConfigError(f"{path}.migDevices", "MIG devices need migEnabled: true")
    peers = _int_list(data, "nvlinkPeers", path)
    for link, peer in enumerate(peers):
        if not 0 <= peer < count or peer == index:
            raise ConfigError(f"{path}.nvlinkPeers[{link}]", f"{peer} is not another GPU's index")
    numa = data.get("numaNode")
    if numa is not None and (not isinstance(numa, int) or isinstance(numa, bool)):
        raise ConfigError(f"{path}.numaNode", "must be an integer")
    return SimGpu(
        uuid=uuid,
        name=name,
        memory_mib=memory_mib,
        pci_bus_id=_bus_id(data, path, index),
        index=index,
        minor=_int(data, "minor", path, index),
        numa_node=numa,
        compute_capability=_capability(data, path),
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=tuple(
            _mig(
                _mapping(entry, f"{path}.migDevices[{i}]"),
                f"{path}.migDevices[{i}]",
                i,
                name,
                memory_mib,
            )
            for i, entry in enumerate(migs)
        ),
        nvlink_peers=tuple(peers),
        nvswitch_links=_int(data, "nvswitchLinks", path, 0),
        host_bridge=_optional_str(data, "hostBridge", path),
        pcie_switches=tuple(str(item) for item in _list(data, "pcieSwitches", path)),
        supported_events=_int(data, "supportedEvents", path, DEFAULT_SUPPORTED_EVENTS),
        not_supported=frozenset(str(item) for item in _list(data, "notSupported", path)),
    )


def _mig(data: Mapping[str, Any], path: str, position: int, gpu_name: str, total: int) -> SimMig:
    profile = _str(data, "profile", path)
    memory = data.get("memoryMiB")
    if memory is not None:
        memory = _int(data, "memoryMiB", path, None)
    try:
        shape = resolve(gpu_name, total, profile, memory)
    except ValueError as err:
        raise ConfigError(f"{path}.profile", str(err)) from err
    return SimMig(
        uuid=_str(data, "uuid", path, prefix="MIG-"),
        gpu_instance_id=_int(data, "gpuInstanceId", path, position + 1),
        compute_instance_id=_int(data, "computeInstanceId", path, 0),
        shape=shape,
        profile=profile,
    )


def _check_unique(gpus: tuple[SimGpu, ...]) -> None:
    seen: set[str] = set()
    for position, gpu in enumerate(gpus):
        for uuid in (gpu.uuid, *(mig.uuid for mig in gpu.mig_devices)):
            if uuid in seen:
                raise ConfigError(f"gpus[{position}]", f"UUID {uuid} appears more than once")
            seen.add(uuid)
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


def _str(data: Mapping[str, Any], key: str, path: str, prefix: str = "") -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.startswith(prefix) or value == prefix:
        expected = f"a string starting with {prefix!r}" if prefix else "a non-empty string"
        raise ConfigError(f"{path}.{key}", f"must be {expected}")
    return value


def _optional_str(data: Mapping[str, Any], key: str, path: str) -> str | None:
    return None if data.get(key) is None else _str(data, key, path)


def _int(data: Mapping[str, Any], key: str, path: str, default: int | None) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{path}.{key}".lstrip("."), "must be a non-negative integer")
    return value


def _bool(data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{path}.{key}", "must be true or false")
    return value


def _list(data: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise ConfigError(f"{path}.{key}", "must be a list")
    return value


def _int_list(data: Mapping[str, Any], key: str, path: str) -> list[int]:
    values = _list(data, key, path)
    for position, value in enumerate(values):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{path}.{key}[{position}]", "must be an integer")
    return values


def _bus_id(data: Mapping[str, Any], path: str, index: int) -> str:
    value = data.get("pciBusId", f"00000000:{0x10 + index:02X}:00.0")
    parts = value.replace(".", ":").split(":") if isinstance(value, str) else []
    try:
        if len(parts) != 4:
            raise ValueError(value)
        for part in parts:
            int(part, 16)
    except ValueError:
        raise ConfigError(f"{path}.pciBusId", "must look like 00000000:07:00.0") from None
    return str(value)


def _capability(data: Mapping[str, Any], path: str) -> tuple[int, int]:
    value = str(data.get("computeCapability", "8.0"))
    major, _, minor = value.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ConfigError(f"{path}.computeCapability", "must look like 8.0")
    return int(major), int(minor)
