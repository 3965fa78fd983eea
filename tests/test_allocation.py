"""Allocate: request validation and the full container response for every strategy.

The module-level tables (CASES, REJECTED), the fake host (`lay_out_host`) and `Case.config`
are meant to be imported by the over-the-socket tests, so both layers pin the same responses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.model.allocation import (
    AllocateOptions,
    ContainerResponse,
    DeviceSpec,
    IdStrategy,
    ListStrategy,
    Mount,
    allocate,
    container_response,
    validate_request,
)
from deviceplugin.model.config import Config, load_config_text, parse_config
from deviceplugin.model.devices import Device, Health, MigDevice
from deviceplugin.model.errors import AllocationError, ConfigError
from deviceplugin.model.hostpaths import parse_mig_minors
from deviceplugin.model.resources import ResourceSet
from deviceplugin.node.hostdevices import HostDevices

# --- the node: two whole GPUs, and GPU 2 (minor 3, so index and minor differ) with MIG on ---


def gpu(index: int, minor: int, uuid: str) -> Device:
    return Device(
        id=uuid, physical_uuid=uuid, gpu_uuid=uuid, gpu_index=index, gpu_minor=minor, numa_node=0
    )


def mig(
    parent: Device, index: int, gi: int, uuid: str, profile: str = "1g.10gb", ci: int = 0
) -> Device:
    slices = int(profile[0])
    return Device(
        id=uuid,
        physical_uuid=uuid,
        gpu_uuid=parent.gpu_uuid,
        gpu_index=parent.gpu_index,
        gpu_minor=parent.gpu_minor,
        numa_node=parent.numa_node,
        mig=MigDevice(uuid, index, gi, ci, profile, 9728 * slices, slices, slices),
    )


def replicas(device: Device, count: int) -> tuple[Device, ...]:
    return tuple(replace(device, id=f"{device.id}::{n}", replica=n) for n in range(count))


GPU_A = gpu(0, 0, "GPU-aaaa")
GPU_B = gpu(1, 1, "GPU-bbbb")
GPU_C = gpu(2, 3, "GPU-cccc")  # MIG parent
MIG_C0 = mig(GPU_C, 0, 1, "MIG-cccc-0")
MIG_C1 = mig(GPU_C, 1, 2, "MIG-cccc-1")
MIG_C2 = mig(GPU_C, 2, 5, "MIG-cccc-2", profile="2g.20gb")

GPUS = ResourceSet("nvidia.com/gpu", (GPU_A, GPU_B))
MIG_1G = ResourceSet("nvidia.com/mig-1g.10gb", (MIG_C0, MIG_C1))
MIG_2G = ResourceSet("nvidia.com/mig-2g.20gb", (MIG_C2,))
SHARED = ResourceSet("nvidia.com/gpu.shared", replicas(GPU_A, 4) + replicas(GPU_B, 4), replicas=4)
SHARED_MIG = ResourceSet(
    "nvidia.com/mig-1g.10gb.shared", replicas(MIG_C0, 2) + replicas(MIG_C1, 2), replicas=2
)

# gpu2/... entries are decoys: the driver keys capabilities by minor (3), not by index (2).
MIG_MINORS = """\
config 1
monitor 2
gpu2/gi1/access 21
gpu2/gi1/ci0/access 22
gpu2/gi2/access 23
gpu2/gi2/ci0/access 24
gpu3/gi1/access 30
gpu3/gi1/ci0/access 31
gpu3/gi2/access 39
gpu3/gi2/ci0/access 40
gpu3/gi5/access 50
gpu3/gi5/ci0/access 51
"""
DEV_FILES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidia3")


def lay_out_host(root: Path) -> HostDevices:
    """A fake driver root: dev nodes (no nvidia-modeset) and proc/driver/nvidia-caps/mig-minors."""
    (root / "dev/nvidia-caps").mkdir(parents=True)
    for name in DEV_FILES:
        (root / "dev" / name).touch()
    minors = root / "proc/driver/nvidia-caps/mig-minors"
    minors.parent.mkdir(parents=True)
    minors.write_text(MIG_MINORS)
    return HostDevices(proc_root=str(root / "proc"))


# --- expected responses: `{dev}` in a host path stands for the dev root ---


def env(value: str) -> dict[str, str]:
    return {"NVIDIA_VISIBLE_DEVICES": value}


def volume_mounts(*ids: str) -> tuple[Mount, ...]:
    return tuple(Mount(f"/var/run/nvidia-container-devices/{i}", "/dev/null", False) for i in ids)


def specs(*paths: str) -> tuple[DeviceSpec, ...]:
    return tuple(DeviceSpec(path, "{dev}" + path, "rw") for path in paths)


def cdi(*ids: str) -> tuple[str, ...]:
    return tuple(f"k8s.device-plugin.nvidia.com/gpu={i}" for i in ids)


def annotation(digest: str, *ids: str) -> dict[str, str]:
    return {f"cdi.k8s.io/nvidia-device-plugin_{digest}": ",".join(cdi(*ids))}


CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True)
class Case:
    id: str
    resource: ResourceSet
    request: tuple[str, ...]
    strategies: tuple[ListStrategy, ...]
    id_strategy: IdStrategy
    pass_device_specs: bool
    expected: ContainerResponse

    def config(self, root: Path) -> Config:
        """The config (file keys, as a user writes them) that serves this case from `root`."""
        return _config(
            {
                "flags": {
                    "nvidiaDriverRoot": str(root),
                    # The feature variables have tests of their own (test_feature_envs_*).
                    "gdrcopyEnabled": False,
                    "gdsEnabled": False,
                    "mofedEnabled": False,
                    "plugin": {
                        "deviceListStrategy": list(self.strategies),
                        "deviceIDStrategy": self.id_strategy,
                        "passDeviceSpecs": self.pass_device_specs,
                    },
                }
            }
        )

    def expected_for(self, root: Path) -> ContainerResponse:
        resolved = tuple(
            replace(s, host_path=s.host_path.replace("{dev}", str(root)))
            for s in self.expected.device_specs
        )
        return replace(self.expected, device_specs=resolved)


GPU_REQ = ("GPU-bbbb", "GPU-aaaa")  # order is kept
MIG_REQ = ("MIG-cccc-1", "MIG-cccc-0")
REPLICA_REQ = ("GPU-aaaa::2", "GPU-bbbb::0", "GPU-aaaa::0")  # maps back to GPU-aaaa, GPU-bbbb
MIG_REPLICA_REQ = ("MIG-cccc-0::1", "MIG-cccc-1::0", "MIG-cccc-0::0")  # MIG-cccc-0, MIG-cccc-1

ENV: tuple[ListStrategy, ...] = ("envvar",)
VM: tuple[ListStrategy, ...] = ("volume-mounts",)
ANN: tuple[ListStrategy, ...] = ("cdi-annotations",)
CRI: tuple[ListStrategy, ...] = ("cdi-cri",)
R = ContainerResponse

# --- the grid: every single strategy x ID strategy x kind x passDeviceSpecs ---


@dataclass(frozen=True)
class Kind:
    """One kind of request and the pinned pieces of its response. `ids` are the runtime IDs
    in response order (replicas mapped back and listed once); `digests` the cdi-annotations
    key suffix for those IDs; `specs` the device nodes given with passDeviceSpecs: control
    nodes that exist (no nvidia-modeset here), then each GPU's node by minor, then each MIG
    device's GPU-instance and compute-instance capability nodes. The digests are literals on
    purpose: the annotation key must not change between releases."""

    name: str
    resource: ResourceSet
    request: tuple[str, ...]
    ids: dict[IdStrategy, tuple[str, ...]]
    digests: dict[IdStrategy, str]
    specs: tuple[str, ...]


CAP = "/dev/nvidia-caps/nvidia-cap"
KINDS = (
    Kind(
        "gpu", GPUS, GPU_REQ,
        ids={"uuid": ("GPU-bbbb", "GPU-aaaa"), "index": ("1", "0")},
        digests={"uuid": "c5062c5e06420dfc", "index": "84d061fc463637db"},
        specs=(*CONTROL, "/dev/nvidia1", "/dev/nvidia0"),
    ),
    Kind(
        "mig", MIG_1G, MIG_REQ,
        ids={"uuid": ("MIG-cccc-1", "MIG-cccc-0"), "index": ("2:1", "2:0")},
        digests={"uuid": "14829232f6f255c7", "index": "d19890f9979dd952"},
        specs=(*CONTROL, "/dev/nvidia3", f"{CAP}39", f"{CAP}40", f"{CAP}30", f"{CAP}31"),
    ),
    Kind(
        "replica", SHARED, REPLICA_REQ,
        ids={"uuid": ("GPU-aaaa", "GPU-bbbb"), "index": ("0", "1")},
        digests={"uuid": "a23f6bcf663133e9", "index": "2a484d5bf5c52d6a"},
        specs=(*CONTROL, "/dev/nvidia0", "/dev/nvidia1"),
    ),
    Kind(
        "mig-replica", SHARED_MIG, MIG_REPLICA_REQ,
        ids={"uuid": ("MIG-cccc-0", "MIG-cccc-1"), "index": ("2:0", "2:1")},
        digests={"uuid": "61c2487c0e452e7d", "index": "daa7d4395fcf892d"},
        specs=(*CONTROL, "/dev/nvidia3", f"{CAP}30", f"{CAP}31", f"{CAP}39", f"{CAP}40"),
    ),
)  # fmt: skip
SINGLE_STRATEGIES = ENV + VM + ANN + CRI
ID_STRATEGIES: tuple[IdStrategy, ...] = ("uuid", "index")


def grid_expected(
    strategy: ListStrategy, kind: Kind, id_strategy: IdStrategy, pass_specs: bool
) -> ContainerResponse:
    """The pinned pieces a single strategy shows. A CDI strategy gives no spec: the CDI spec
    the runtime reads lists the nodes."""
    ids = kind.ids[id_strategy]
    if strategy == "cdi-annotations":
        return R(annotations=annotation(kind.digests[id_strategy], *ids))
    if strategy == "cdi-cri":
        return R(cdi_devices=cdi(*ids))
    if strategy == "envvar":
        response = R(envs=env(",".join(ids)))
    else:  # volume-mounts
        response = R(envs=env("/var/run/nvidia-container-devices"), mounts=volume_mounts(*ids))
    return replace(response, device_specs=specs(*kind.specs)) if pass_specs else response


def grid_case(
    strategy: ListStrategy, kind: Kind, id_strategy: IdStrategy, pass_specs: bool
) -> Case:
    """`<strategy>-<id strategy>-<kind>`, then `-specs` with passDeviceSpecs, or
    `-specs-ignored` where the strategy is CDI and the flag has no effect."""
    suffix = ""
    if pass_specs:
        suffix = "-specs-ignored" if strategy.startswith("cdi-") else "-specs"
    return Case(
        f"{strategy}-{id_strategy}-{kind.name}{suffix}",
        kind.resource,
        kind.request,
        (strategy,),
        id_strategy,
        pass_specs,
        grid_expected(strategy, kind, id_strategy, pass_specs),
    )


GRID: list[Case] = [
    grid_case(strategy, kind, id_strategy, pass_specs)
    for strategy in SINGLE_STRATEGIES
    for kind in KINDS
    for id_strategy in ID_STRATEGIES
    for pass_specs in (False, True)
]


def test_the_grid_is_the_full_cross_product() -> None:
    assert len(GRID) == len(SINGLE_STRATEGIES) * len(ID_STRATEGIES) * len(KINDS) * 2 == 64
    assert len({case.id for case in CASES}) == len(CASES)


# --- special behaviour: several strategies listed together ---

COMBINATIONS: list[Case] = [
    Case(
        "envvar+volume-mounts-uuid-gpu", GPUS, GPU_REQ, ENV + VM, "uuid", False,
        R(envs=env("/var/run/nvidia-container-devices"),
          mounts=volume_mounts("GPU-bbbb", "GPU-aaaa")),
    ),
    Case(
        "envvar+cdi-cri-index-mig-specs", MIG_1G, ("MIG-cccc-0",), ENV + CRI, "index", True,
        R(envs=env("2:0"), cdi_devices=cdi("2:0"),
          device_specs=specs(
              *CONTROL, "/dev/nvidia3",
              "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31",
          )),
    ),
    Case(
        "volume-mounts+cdi-annotations-uuid-gpu", GPUS, ("GPU-aaaa",), VM + ANN, "uuid", False,
        R(envs=env("/var/run/nvidia-container-devices"), mounts=volume_mounts("GPU-aaaa"),
          annotations=annotation("5beb3236b089576c", "GPU-aaaa")),
    ),
]  # fmt: skip

CASES: list[Case] = GRID + COMBINATIONS


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    return tmp_path / "host"


@pytest.fixture
def host(host_root: Path) -> HostDevices:
    return lay_out_host(host_root)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_container_response(case: Case, host_root: Path, host: HostDevices) -> None:
    options = AllocateOptions.from_config(case.config(host_root))
    devices = validate_request(case.resource, case.request)
    assert container_response(devices, options, host) == case.expected_for(host_root)


def test_host_paths_are_normalised_and_under_the_dev_root(tmp_path: Path) -> None:
    """nvidiaDevRoot, when set, decides both where nodes are looked for and the host paths."""
    dev_root = tmp_path / "devroot"
    (dev_root / "dev").mkdir(parents=True)
    (tmp_path / "driver").mkdir()
    (dev_root / "dev/nvidia-modeset").touch()
    config = _config(
        {
            "flags": {
                "nvidiaDriverRoot": str(tmp_path / "driver"),
                "nvidiaDevRoot": f"{dev_root}/./",
                "plugin": {"passDeviceSpecs": True},
            }
        }
    )
    options = AllocateOptions.from_config(config)
    response = container_response((GPU_B,), options, HostDevices(str(tmp_path / "proc")))
    assert response.device_specs == (
        DeviceSpec("/dev/nvidia-modeset", f"{dev_root}/dev/nvidia-modeset", "rw"),
        DeviceSpec("/dev/nvidia1", f"{dev_root}/dev/nvidia1", "rw"),
    )


# --- validation ---

GPUS_SICK = ResourceSet(
    "nvidia.com/gpu",
    (GPU_A, replace(GPU_B, health=Health.UNHEALTHY, reason="XID 79: GPU has fallen off the bus")),
)
MIG_SICK = ResourceSet("nvidia.com/mig-1g.10gb", (replace(MIG_C0, health=Health.UNHEALTHY),))
SHARED_STRICT = replace(SHARED, fail_requests_greater_than_one=True)
MANY_UNKNOWN = tuple(f"GPU-x{n}" for n in range(10_000))


@dataclass(frozen=True)
class Rejected:
    id: str
    resource: ResourceSet
    request: tuple[str, ...]
    message: str  # the exact AllocationError text


REJECTED: list[Rejected] = [
    Rejected("empty", GPUS, (), "empty request for nvidia.com/gpu: no device IDs"),
    Rejected(
        "unknown",
        GPUS,
        ("GPU-aaaa", "GPU-zzzz"),
        "unknown device IDs for nvidia.com/gpu: GPU-zzzz",
    ),
    Rejected(
        "id-of-another-resource",
        GPUS,
        ("MIG-cccc-0",),
        "unknown device IDs for nvidia.com/gpu: MIG-cccc-0",
    ),
    Rejected(
        "replica-id-on-the-dedicated-resource",
        GPUS,
        ("GPU-aaaa::0",),
        "unknown device IDs for nvidia.com/gpu: GPU-aaaa::0",
    ),
    Rejected(
        "ten-thousand-unknown-bounded",
        GPUS,
        MANY_UNKNOWN,
        "unknown device IDs for nvidia.com/gpu: GPU-x0, GPU-x1, GPU-x2, GPU-x3, GPU-x4"
        " ... and 9995 more",
    ),
    Rejected(
        "unhealthy-with-reason",
        GPUS_SICK,
        ("GPU-aaaa", "GPU-bbbb"),
        "unhealthy devices for nvidia.com/gpu: GPU-bbbb (XID 79: GPU has fallen off the bus)",
    ),
    Rejected(
        "unhealthy-without-reason",
        MIG_SICK,
        ("MIG-cccc-0",),
        "unhealthy devices for nvidia.com/mig-1g.10gb: MIG-cccc-0 (no reason recorded)",
    ),
    Rejected(
        "duplicate-ids",
        GPUS,
        ("GPU-aaaa", "GPU-bbbb", "GPU-aaaa"),
        "request for nvidia.com/gpu names device IDs more than once: GPU-aaaa",
    ),
    Rejected(
        "shared-more-than-one",
        SHARED_STRICT,
        ("GPU-aaaa::0", "GPU-bbbb::1"),
        "request for 'nvidia.com/gpu.shared: 2' too large: "
        "maximum request size for shared resources is 1",
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in REJECTED])
def test_rejected_requests(case: Rejected) -> None:
    with pytest.raises(AllocationError) as caught:
        validate_request(case.resource, case.request)
    assert str(caught.value) == case.message


def test_a_huge_request_gives_a_short_message() -> None:
    with pytest.raises(AllocationError) as caught:
        validate_request(GPUS, (*MANY_UNKNOWN, "GPU-aaaa", *MANY_UNKNOWN[:3]))
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize(
    ("resource", "request_ids"),
    [
        pytest.param(SHARED_STRICT, ("GPU-bbbb::3",), id="shared-strict-one"),
        pytest.param(SHARED, ("GPU-aaaa::0", "GPU-aaaa::1"), id="shared-lenient-two"),
        pytest.param(
            replace(GPUS, fail_requests_greater_than_one=True),
            ("GPU-aaaa", "GPU-bbbb"),
            id="flag-ignored-on-dedicated",
        ),
    ],
)
def test_accepted_requests_return_devices_in_request_order(
    resource: ResourceSet, request_ids: tuple[str, ...]
) -> None:
    devices = validate_request(resource, request_ids)
    assert tuple(device.id for device in devices) == request_ids


def test_replicas_of_one_gpu_map_back_to_it_once(host_root: Path, host: HostDevices) -> None:
    options = AllocateOptions(pass_device_specs=True, dev_root=str(host_root))
    devices = validate_request(SHARED, ("GPU-aaaa::3", "GPU-aaaa::1", "GPU-aaaa::0"))
    response = container_response(devices, options, host)
    assert response.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}
    assert [s.container_path for s in response.device_specs].count("/dev/nvidia0") == 1


# --- options ---


def test_options_from_default_config() -> None:
    assert AllocateOptions.from_config(Config()) == AllocateOptions(
        device_list_strategy=("envvar",),
        device_id_strategy="uuid",
        pass_device_specs=False,
        dev_root="/",
        cdi_annotation_prefix="cdi.k8s.io/",
        cdi_kind="k8s.device-plugin.nvidia.com/gpu",
        feature_envs=("NVIDIA_GDRCOPY", "NVIDIA_GDS", "NVIDIA_MOFED"),
    )


FEATURES = {
    "gdrcopyEnabled": "NVIDIA_GDRCOPY",
    "gdsEnabled": "NVIDIA_GDS",
    "mofedEnabled": "NVIDIA_MOFED",
}


@pytest.mark.parametrize("key", FEATURES)
@pytest.mark.parametrize("strategy", ["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"])
def test_feature_envs_are_on_by_default_and_off_by_their_key(
    key: str, strategy: str, host: HostDevices
) -> None:
    """As in the reference v0.19.0: every response asks the NVIDIA runtime for GDRCopy, GDS and
    MOFED unless the config turns one off, whatever the device list strategy."""
    devices = validate_request(SHARED, ("GPU-aaaa::0",))
    plugin = {"deviceListStrategy": [strategy]}
    default = AllocateOptions.from_config(_config({"flags": {"plugin": plugin}}))
    assert (
        container_response(devices, default, host).envs.items()
        >= {name: "enabled" for name in FEATURES.values()}.items()
    )
    off = AllocateOptions.from_config(_config({"flags": {key: False, "plugin": plugin}}))
    envs = container_response(devices, off, host).envs
    assert FEATURES[key] not in envs
    assert all(envs[name] == "enabled" for other, name in FEATURES.items() if other != key)


def test_feature_envs_follow_the_reference_environment_variable() -> None:
    config = load_config_text(
        "version: v1\nflags: {gdsEnabled: true}\n", None, {}, {"GDS_ENABLED": "false"}
    )
    assert AllocateOptions.from_config(config.config).feature_envs == (
        "NVIDIA_GDRCOPY",
        "NVIDIA_MOFED",
    )


def test_options_count_a_repeated_strategy_once() -> None:
    config = _config(
        {"flags": {"plugin": {"deviceListStrategy": ["envvar", "volume-mounts", "envvar"]}}}
    )
    options = AllocateOptions.from_config(config)
    assert options.device_list_strategy == ("envvar", "volume-mounts")


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        pytest.param(
            {"device_list_strategy": ("cdi-annotations", "cdi-cri")},
            "flags.plugin.deviceListStrategy",
            id="both-cdi",
        ),
        pytest.param({"device_list_strategy": ()}, "flags.plugin.deviceListStrategy", id="none"),
        pytest.param(
            {"device_list_strategy": ("envvar", "cdi-annotations"), "cdi_annotation_prefix": ""},
            "flags.plugin.cdiAnnotationPrefix",
            id="cdi-annotations-empty-prefix",
        ),
    ],
)
def test_options_reject_unworkable_combinations(kwargs: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        AllocateOptions(**kwargs)
    assert caught.value.path == path


def test_empty_prefix_is_fine_without_cdi_annotations() -> None:
    assert AllocateOptions(("cdi-cri",), cdi_annotation_prefix="").cdi_only


def test_custom_cdi_annotation_prefix(host: HostDevices) -> None:
    options = AllocateOptions(("cdi-annotations",), cdi_annotation_prefix="example.com/")
    response = container_response((GPU_B, GPU_A), options, host)
    assert response == ContainerResponse(
        annotations={
            "example.com/nvidia-device-plugin_c5062c5e06420dfc": (
                "k8s.device-plugin.nvidia.com/gpu=GPU-bbbb,k8s.device-plugin.nvidia.com/gpu=GPU-aaaa"
            )
        }
    )


# --- host files ---


def test_parse_mig_minors_skips_lines_of_another_shape() -> None:
    text = "config 1\ngpu0/gi1/access 7\n\nnonsense\ngpu0/gi1/ci0/access x\ngpu0/gi1/ci0/access 8\n"
    assert parse_mig_minors(text) == {"config": 1, "gpu0/gi1/access": 7, "gpu0/gi1/ci0/access": 8}


def test_found_nodes_are_cached_and_missing_ones_looked_for_again(
    host_root: Path, host: HostDevices
) -> None:
    options = AllocateOptions(pass_device_specs=True, dev_root=str(host_root))

    def nodes() -> list[str]:
        specs = container_response((GPU_A,), options, host).device_specs
        return [s.container_path for s in specs]

    assert nodes() == [*CONTROL, "/dev/nvidia0"]
    (host_root / "dev/nvidia-modeset").touch()
    os.remove(host_root / "dev/nvidia-uvm-tools")
    assert nodes() == [*CONTROL, "/dev/nvidia-modeset", "/dev/nvidia0"]
    host.refresh()
    assert nodes() == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset", "/dev/nvidia0"]


def test_mig_minors_are_read_once_until_refresh(host_root: Path, host: HostDevices) -> None:
    options = AllocateOptions(pass_device_specs=True, dev_root=str(host_root))

    def caps() -> list[str]:
        specs = container_response((MIG_C0,), options, host).device_specs
        return [s.container_path for s in specs if "nvidia-caps" in s.container_path]

    assert caps() == ["/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"]
    minors = host_root / "proc/driver/nvidia-caps/mig-minors"
    minors.write_text("gpu3/gi1/access 60\ngpu3/gi1/ci0/access 61\n")
    assert caps() == ["/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"]
    host.refresh()
    assert caps() == ["/dev/nvidia-caps/nvidia-cap60", "/dev/nvidia-caps/nvidia-cap61"]


@pytest.mark.parametrize(
    ("device", "missing"),
    [
        pytest.param(
            mig(GPU_C, 3, 7, "MIG-cccc-7"),
            "no GPU instance access capability 'gpu3/gi7/access'",
            id="gpu-instance",
        ),
        pytest.param(
            mig(GPU_C, 2, 5, "MIG-cccc-2", profile="2g.20gb", ci=1),
            "no compute instance access capability 'gpu3/gi5/ci1/access'",
            id="compute-instance",
        ),
    ],
)
def test_missing_mig_capability_names_device_and_entry(
    device: Device, missing: str, host_root: Path, host: HostDevices
) -> None:
    options = AllocateOptions(pass_device_specs=True, dev_root=str(host_root))
    with pytest.raises(AllocationError) as caught:
        container_response((device,), options, host)
    minors = host_root / "proc/driver/nvidia-caps/mig-minors"
    assert str(caught.value) == f"MIG device {device.id} ({device.index_id}): {missing} in {minors}"


def test_missing_mig_minors_file_reads_as_no_capabilities(tmp_path: Path) -> None:
    options = AllocateOptions(pass_device_specs=True, dev_root=str(tmp_path))
    with pytest.raises(AllocationError, match="'gpu3/gi1/access'"):
        container_response((MIG_C0,), options, HostDevices(str(tmp_path / "proc")))


# --- several containers ---


def test_allocate_answers_each_container_with_its_own_devices(host: HostDevices) -> None:
    requests = [("GPU-bbbb",), ("GPU-aaaa",)]
    assert allocate(GPUS, requests, AllocateOptions(), host) == (
        ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-bbbb"}),
        ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}),
    )


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        pytest.param(
            [], "allocate request for nvidia.com/gpu has no container requests", id="none"
        ),
        pytest.param(
            [("GPU-aaaa",), ("GPU-nope",)],
            "unknown device IDs for nvidia.com/gpu: GPU-nope",
            id="second-container-bad",
        ),
    ],
)
def test_allocate_fails_the_whole_call(
    requests: list[tuple[str, ...]], message: str, host: HostDevices
) -> None:
    with pytest.raises(AllocationError) as caught:
        allocate(GPUS, requests, AllocateOptions(), host)
    assert str(caught.value) == message


# --- one container, two MIG resources (reference issue #728) ---


def kubelet_merge(responses: Sequence[ContainerResponse]) -> ContainerResponse:
    """What the kubelet does with one container's responses from several resources: the first
    value wins per env name, mount and device container path, and annotation key; CDI names
    are de-duplicated."""
    envs: dict[str, str] = {}
    mounts: dict[str, Mount] = {}
    device_specs: dict[str, DeviceSpec] = {}
    annotations: dict[str, str] = {}
    for response in responses:
        for key, value in response.envs.items():
            envs.setdefault(key, value)
        for mount in response.mounts:
            mounts.setdefault(mount.container_path, mount)
        for spec in response.device_specs:
            device_specs.setdefault(spec.container_path, spec)
        for key, value in response.annotations.items():
            annotations.setdefault(key, value)
    cdi_devices = dict.fromkeys(name for r in responses for name in r.cdi_devices)
    return ContainerResponse(
        envs, tuple(mounts.values()), tuple(device_specs.values()), annotations, tuple(cdi_devices)
    )


def visible_devices(response: ContainerResponse) -> set[str]:
    """The device IDs the container runtime would expose for a merged response."""
    ids: set[str] = set()
    listed = response.envs.get("NVIDIA_VISIBLE_DEVICES", "")
    if listed and listed != "/var/run/nvidia-container-devices":
        ids.update(listed.split(","))
    ids.update(m.container_path.rsplit("/", 1)[1] for m in response.mounts)
    names = [*response.cdi_devices, *",".join(response.annotations.values()).split(",")]
    ids.update(name.split("=", 1)[1] for name in names if "=" in name)
    return ids


@pytest.mark.parametrize(
    ("strategies", "visible"),
    [
        pytest.param(ENV, {"MIG-cccc-0"}, id="envvar-loses-the-second-resource"),
        pytest.param(VM, {"MIG-cccc-0", "MIG-cccc-2"}, id="volume-mounts"),
        pytest.param(ANN, {"MIG-cccc-0", "MIG-cccc-2"}, id="cdi-annotations"),
        pytest.param(CRI, {"MIG-cccc-0", "MIG-cccc-2"}, id="cdi-cri"),
    ],
)
def test_two_mig_resources_in_one_container(
    strategies: tuple[ListStrategy, ...], visible: set[str], host_root: Path, host: HostDevices
) -> None:
    options = AllocateOptions(strategies, pass_device_specs=True, dev_root=str(host_root))
    first = allocate(MIG_1G, [("MIG-cccc-0",)], options, host)[0]
    second = allocate(MIG_2G, [("MIG-cccc-2",)], options, host)[0]
    merged = kubelet_merge([first, second])
    assert visible_devices(merged) == visible
    if strategies == ENV:  # the documented limit: same key, different values
        assert first.envs.keys() == second.envs.keys()
        assert first.envs != second.envs
    else:  # every device's key is its own; keys shared by both carry the same value
        assert set(first.annotations).isdisjoint(second.annotations)
        assert {m.container_path for m in first.mounts}.isdisjoint(
            m.container_path for m in second.mounts
        )
        for key in first.envs.keys() & second.envs.keys():
            assert first.envs[key] == second.envs[key]
    caps = {s.container_path for s in merged.device_specs if "nvidia-caps" in s.container_path}
    expected_caps = {f"/dev/nvidia-caps/nvidia-cap{n}" for n in (30, 31, 50, 51)}
    assert caps == (set() if options.cdi_only else expected_caps)


def _config(document: dict[str, Any]) -> Config:
    """A config as a file holding `document` gives it."""
    return parse_config(json.dumps(document)).config
