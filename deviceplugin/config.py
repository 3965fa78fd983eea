"""The v1 config file (the reference plugin's schema) as pydantic models, validated with field
paths, merged with flags and environment (flag > env > file > default).

INTERFACE DRAFT: field names below are the contract other modules use; validation, warnings,
unknown-key rejection and the merge are still to be written.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MigStrategy = Literal["none", "single", "mixed"]
DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
DeviceIdStrategy = Literal["uuid", "index"]
SharedDevicesAllocationPolicy = Literal["distributed", "packed"]


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="forbid")


class PluginFlags(_Model):
    pass_device_specs: bool = Field(False, alias="passDeviceSpecs")
    device_list_strategy: tuple[DeviceListStrategy, ...] = Field(
        ("envvar",), alias="deviceListStrategy"
    )
    device_id_strategy: DeviceIdStrategy = Field("uuid", alias="deviceIDStrategy")
    cdi_annotation_prefix: str = Field("cdi.k8s.io/", alias="cdiAnnotationPrefix")
    shared_devices_allocation_policy: SharedDevicesAllocationPolicy = Field(
        "distributed", alias="sharedDevicesAllocationPolicy"
    )


class Flags(_Model):
    mig_strategy: MigStrategy = Field("none", alias="migStrategy")
    fail_on_init_error: bool = Field(True, alias="failOnInitError")
    nvidia_driver_root: str = Field("/", alias="nvidiaDriverRoot")
    nvidia_dev_root: str | None = Field(None, alias="nvidiaDevRoot")  # None: same as driver root
    plugin: PluginFlags = PluginFlags()

    @property
    def dev_root(self) -> str:
        return self.nvidia_dev_root or self.nvidia_driver_root


class ResourcePattern(_Model):
    pattern: str
    name: str


class Resources(_Model):
    gpus: tuple[ResourcePattern, ...] = ()
    mig: tuple[ResourcePattern, ...] = ()


class ReplicatedResource(_Model):
    name: str  # fully qualified, e.g. nvidia.com/gpu (a short "gpu" is qualified on load)
    rename: str | None = None
    devices: Literal["all"] | tuple[str, ...] = "all"  # "all", or GPU indices / UUIDs as strings
    replicas: int


class TimeSlicing(_Model):
    rename_by_default: bool = Field(False, alias="renameByDefault")
    fail_requests_greater_than_one: bool = Field(False, alias="failRequestsGreaterThanOne")
    resources: tuple[ReplicatedResource, ...] = ()


class Sharing(_Model):
    time_slicing: TimeSlicing | None = Field(None, alias="timeSlicing")


class Config(_Model):
    version: Literal["v1"] = "v1"
    flags: Flags = Flags()
    resources: Resources = Resources()
    sharing: Sharing = Sharing()
