"""Allocate: check a kubelet request against a ResourceSet, then build each container's
response (env, mounts, device specs, CDI names) in the reference plugin's exact formats.

Pure functions over the device model; the two host facts needed (which control nodes exist,
the MIG capability minors) come from a HostFacts, which `deviceplugin.node` reads. The server
turns ContainerResponse into protobuf and errors into gRPC status codes.

Known limit of the `envvar` strategy (reference issue #728): the kubelet merges the responses of
all resources of one container and keeps the first value of each env var, so a container that
asks for two resources (say two MIG profiles) sees only one resource's devices. `volume-mounts`
and the CDI strategies give every device its own key and do not collide; see docs/allocate.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Literal, Protocol

from deviceplugin.model.config import Config
from deviceplugin.model.devices import Device
from deviceplugin.model.errors import AllocationError, ConfigError
from deviceplugin.model.hostpaths import (
    capability_node,
    compute_instance_key,
    gpu_instance_key,
    host_path,
    mps_paths,
)
from deviceplugin.model.record import record
from deviceplugin.model.resources import ResourceSet

ListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
IdStrategy = Literal["uuid", "index"]

CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
CDI_STRATEGIES = frozenset({"cdi-annotations", "cdi-cri"})
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_NAME = "nvidia-device-plugin"
CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
MESSAGE_ID_LIMIT = 5  # IDs named in one error message; the rest are counted
# Where an MPS client finds its daemon: the reference's container paths.
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_CONTAINER_ROOT = "/mps"
MPS_CONTAINER_SHM = "/dev/shm"


def cdi_enabled(config: Config) -> bool:
    """Whether any device-list strategy hands out CDI names, so a spec must define them."""
    return bool(CDI_STRATEGIES & set(config.flags.plugin.device_list_strategy))


def spec_file_name(kind: str = CDI_KIND) -> str:
    """`k8s.device-plugin.nvidia.com-gpu.json`: the kind with `/` replaced, as the reference
    names it, so a node moving between the two plugins keeps one file."""
    return kind.replace("/", "-") + ".json"


class HostFacts(Protocol):
    """The host's answers Allocate needs: which device nodes exist, and the MIG capability
    minors of the driver's mig-minors table."""

    @property
    def mig_minors_path(self) -> str: ...

    def exists(self, path: str) -> bool: ...

    def mig_minor(self, key: str) -> int | None: ...


@record(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@record(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@record(frozen=True)
class ContainerResponse:
    """What one container is given; mirrors v1beta1 ContainerAllocateResponse."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()  # fully qualified CDI names, `<kind>=<id>`


@record(frozen=True)
class AllocateOptions:
    """The flags that shape a response. Construction rejects combinations that cannot work,
    so a bad config fails at start-up rather than at the first pod."""

    device_list_strategy: tuple[ListStrategy, ...] = ("envvar",)
    device_id_strategy: IdStrategy = "uuid"
    pass_device_specs: bool = False
    dev_root: str = "/"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    cdi_kind: str = CDI_KIND
    # Variables every response carries, whatever the strategy (the reference's GDRCopy, GDS and
    # MOFED switches: `NVIDIA_GDS=enabled` asks the NVIDIA runtime to add GPUDirect Storage).
    feature_envs: tuple[str, ...] = ()
    mps_root: str | None = None  # flags.mpsRoot: the host side of an MPS resource's mounts

    def __post_init__(self) -> None:
        strategies = self.device_list_strategy
        if not strategies:
            raise ConfigError("flags.plugin.deviceListStrategy", "at least one strategy is needed")
        if "cdi-annotations" in strategies and "cdi-cri" in strategies:
            # Both hand the same CDI devices to the runtime (and the kubelet also writes CDI
            # annotations for cdi-cri); the reference warns against the pair.
            raise ConfigError(
                "flags.plugin.deviceListStrategy",
                "cdi-annotations and cdi-cri both pass the same CDI devices; choose one",
            )
        if "cdi-annotations" in strategies and not self.cdi_annotation_prefix:
            raise ConfigError(
                "flags.plugin.cdiAnnotationPrefix",
                "must not be empty when deviceListStrategy includes cdi-annotations",
            )

    @classmethod
    def from_config(cls, config: Config) -> AllocateOptions:
        """The options in `config`; a strategy listed twice counts once."""
        plugin = config.flags.plugin
        return cls(
            device_list_strategy=tuple(dict.fromkeys(plugin.device_list_strategy)),
            device_id_strategy=plugin.device_id_strategy,
            pass_device_specs=plugin.pass_device_specs,
            dev_root=config.flags.dev_root,
            cdi_annotation_prefix=plugin.cdi_annotation_prefix,
            feature_envs=feature_envs(config),
            mps_root=config.flags.mps_root,
        )

    @property
    def cdi_only(self) -> bool:
        """Every strategy is CDI: the runtime injects everything, so no env, mount or spec."""
        return all(s in ("cdi-annotations", "cdi-cri") for s in self.device_list_strategy)


def feature_envs(config: Config) -> tuple[str, ...]:
    """The feature variables `config` switches on, in the reference's order."""
    flags = config.flags
    switches = (
        ("NVIDIA_GDRCOPY", flags.gdrcopy_enabled),
        ("NVIDIA_GDS", flags.gds_enabled),
        ("NVIDIA_MOFED", flags.mofed_enabled),
    )
    return tuple(name for name, enabled in switches if enabled)


def validate_request(resource: ResourceSet, device_ids: Sequence[str]) -> tuple[Device, ...]:
    """The Devices behind one container's request, in request order. Raises AllocationError
    for an empty request, repeated, unknown or Unhealthy IDs, and a request for more than one
    replica where `failRequestsGreaterThanOne` is set."""
    if not device_ids:
        raise AllocationError(f"empty request for {resource.name}: no device IDs")
    if len(set(device_ids)) != len(device_ids):
        repeated = [device_id for device_id, n in Counter(device_ids).items() if n > 1]
        raise AllocationError(
            f"request for {resource.name} names device IDs more than once: {_listed(repeated)}"
        )
    known = resource.by_id()
    unknown = [device_id for device_id in device_ids if device_id not in known]
    if unknown:
        raise AllocationError(f"unknown device IDs for {resource.name}: {_listed(unknown)}")
    if resource.shared and resource.fail_requests_greater_than_one and len(device_ids) > 1:
        raise AllocationError(
            f"request for '{resource.name}: {len(device_ids)}' too large: "
            "maximum request size for shared resources is 1"
        )
    devices = tuple(known[device_id] for device_id in device_ids)
    unhealthy = [f"{d.id} ({d.reason or 'no reason recorded'})" for d in devices if not d.healthy]
    if unhealthy:
        raise AllocationError(f"unhealthy devices for {resource.name}: {_listed(unhealthy)}")
    return devices


def _mps_client(resource: str, mps_root: str) -> tuple[dict[str, str], tuple[Mount, ...]]:
    """What a container of an MPS resource is given in every strategy: the pipe directory as the
    reference names it in the container, and the daemon's pipe and shm mounted there."""
    pipe, _, shm = mps_paths(mps_root, resource)
    container_pipe = mps_paths(MPS_CONTAINER_ROOT, resource)[0]
    mounts = (Mount(container_pipe, pipe), Mount(MPS_CONTAINER_SHM, shm))
    return {MPS_PIPE_ENV: container_pipe}, mounts


def container_response(
    devices: Sequence[Device],
    options: AllocateOptions,
    host: HostFacts,
    mps_resource: str | None = None,
) -> ContainerResponse:
    """The response for one container given these (validated) devices. Replicas of one GPU
    map back to that GPU once. With `envvar` only one resource per container is visible
    (#728, see the module docstring). `mps_resource`: the devices are that resource's MPS
    replicas, so the container is pointed at its daemon first, whatever the strategy."""
    physical = _unique_physical(devices)
    ids = tuple(_runtime_id(d, options.device_id_strategy) for d in physical)
    strategies = options.device_list_strategy
    cdi_names = tuple(f"{options.cdi_kind}={device_id}" for device_id in ids)
    annotations: dict[str, str] = {}
    if "cdi-annotations" in strategies:
        key = _cdi_annotation_key(options.cdi_annotation_prefix, cdi_names)
        annotations[key] = ",".join(cdi_names)
    cdi_devices = cdi_names if "cdi-cri" in strategies else ()
    envs: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    if mps_resource is not None and options.mps_root is not None:
        envs, mounts = _mps_client(mps_resource, options.mps_root)
    envs.update(dict.fromkeys(options.feature_envs, "enabled"))
    if options.cdi_only:
        return ContainerResponse(
            envs=envs, mounts=mounts, annotations=annotations, cdi_devices=cdi_devices
        )
    if "envvar" in strategies:
        envs[VISIBLE_DEVICES] = ",".join(ids)
    if "volume-mounts" in strategies:
        envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT  # overrides envvar, as the reference does
        mounts += tuple(Mount(f"{VOLUME_MOUNTS_ROOT}/{i}", "/dev/null") for i in ids)
    specs = _device_specs(physical, options.dev_root, host) if options.pass_device_specs else ()
    return ContainerResponse(
        envs=envs,
        mounts=mounts,
        device_specs=specs,
        annotations=annotations,
        cdi_devices=cdi_devices,
    )


def allocate(
    resource: ResourceSet,
    container_requests: Sequence[Sequence[str]],
    options: AllocateOptions,
    host: HostFacts,
) -> tuple[ContainerResponse, ...]:
    """One response per container request, each built from that container's IDs only. Every
    request is validated before any response is built, so a bad one fails the whole call."""
    if not container_requests:
        raise AllocationError(f"allocate request for {resource.name} has no container requests")
    chosen = [validate_request(resource, device_ids) for device_ids in container_requests]
    mps_resource = resource.name if resource.mps else None
    return tuple(container_response(devices, options, host, mps_resource) for devices in chosen)


def _listed(items: Sequence[str]) -> str:
    """Comma-joined, naming at most MESSAGE_ID_LIMIT items, so a huge request gives a short
    message."""
    shown = ", ".join(items[:MESSAGE_ID_LIMIT])
    rest = len(items) - MESSAGE_ID_LIMIT
    return f"{shown} ... and {rest} more" if rest > 0 else shown


def _unique_physical(devices: Sequence[Device]) -> tuple[Device, ...]:
    first: dict[str, Device] = {}
    for device in devices:
        first.setdefault(device.physical_uuid, device)
    return tuple(first.values())


def _runtime_id(device: Device, strategy: IdStrategy) -> str:
    return device.physical_uuid if strategy == "uuid" else device.index_id


def _cdi_annotation_key(prefix: str, cdi_names: Sequence[str]) -> str:
    """`<prefix>nvidia-device-plugin_<suffix>`. The reference's suffix is a random uuid4; a
    digest of the device names is used instead. It is unique where it matters (two resources in
    one container name different devices, so their keys differ), equal keys can only carry
    equal values (so the kubelet's first-wins merge by key never drops a device), and the same
    request always gets the same response (kubelet checkpoint, tests). 16 hex digits keep the
    name part at 37 characters, within the 63 allowed."""
    import hashlib  # here: OpenSSL's hashes cost 0.7 MiB, and only CDI annotations use one

    digest = hashlib.sha256(",".join(cdi_names).encode()).hexdigest()[:16]
    return f"{prefix}{CDI_ANNOTATION_NAME}_{digest}"


def _device_specs(
    devices: Sequence[Device], dev_root: str, host: HostFacts
) -> tuple[DeviceSpec, ...]:
    """Control nodes that exist, then each GPU's node (the parent's for MIG, once per GPU) and
    each MIG device's two capability nodes; all "rw", host paths under the dev root."""
    paths = [node for node in CONTROL_NODES if host.exists(host_path(dev_root, node))]
    for device in devices:
        paths.append(f"/dev/nvidia{device.gpu_minor}")
        paths.extend(_mig_capability_nodes(device, host))
    unique = dict.fromkeys(paths)  # the kubelet keys devices by container path
    return tuple(DeviceSpec(path, host_path(dev_root, path), "rw") for path in unique)


def _mig_capability_nodes(device: Device, host: HostFacts) -> tuple[str, ...]:
    """The GPU-instance and compute-instance access nodes of a MIG device. mig-minors keys
    name the parent by its minor number (`gpu<minor>/...`), which is what the driver uses for
    /proc/driver/nvidia/capabilities/gpu<minor>; NVML's index can differ from it."""
    mig = device.mig
    if mig is None:
        return ()
    gi_key = gpu_instance_key(device.gpu_minor, mig.gpu_instance_id)
    ci_key = compute_instance_key(device.gpu_minor, mig.gpu_instance_id, mig.compute_instance_id)
    nodes = []
    for capability, key in (("GPU instance", gi_key), ("compute instance", ci_key)):
        minor = host.mig_minor(key)
        if minor is None:
            raise AllocationError(
                f"MIG device {mig.uuid} ({device.index_id}): no {capability} access capability "
                f"'{key}' in {host.mig_minors_path}"
            )
        nodes.append(capability_node(minor))
    return tuple(nodes)
