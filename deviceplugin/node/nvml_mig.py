"""The NVML calls that change a GPU's MIG layout (dynamic MIG): MIG mode, a GPU instance at a
placement with its full-size compute instance, their destruction, and the list of the GPU
instances a GPU has now.

`nvml.py` reads; this module writes, through the same `Nvml` object (the same bound library and
error translation) and pynvml's functions named in `MigModule`. The Python fake (`--simulate`)
has none of them: there `MigControl` answers NOT_SUPPORTED, and dynamic MIG is exercised on the
simulated libnvidia-ml.so.1 of a `sim-root`, whose MIG state every process on the root shares.

Calls for one GPU are serialized by a lock per GPU (a cut is a sequence of calls another thread's
listing must not interleave with); each method blocks and belongs off the event loop.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, cast

from deviceplugin.model.errors import NvmlError
from deviceplugin.model.record import record
from deviceplugin.node.nvml import (
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    Nvml,
)

_GPU_INSTANCE_PROFILE_COUNT = 0x12
_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
_ENGINE_SHARED = 0
_MAX_COMPUTE_INSTANCES = 8
MIG_DISABLE, MIG_ENABLE = 0, 1


class MigModule(Protocol):
    """pynvml's MIG-changing functions (the simulated library exports them all)."""

    @property
    def NVMLError(self) -> type[Exception]: ...
    @property
    def c_nvmlGpuInstancePlacement_t(self) -> type[Any]: ...
    @property
    def c_nvmlGpuInstance_t(self) -> type[Any]: ...
    @property
    def c_nvmlComputeInstance_t(self) -> type[Any]: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str, /) -> Any: ...
    def nvmlDeviceGetMigMode(self, handle: Any, /) -> Any: ...
    def nvmlDeviceSetMigMode(self, handle: Any, mode: int, /) -> Any: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, /) -> Any: ...
    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: int, buffer: Any, count: Any, /
    ) -> Any: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: int, placement: Any, /
    ) -> Any: ...
    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int, /) -> Any: ...
    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any, /) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: Any, profile: int, engine_profile: int, /
    ) -> Any: ...
    def nvmlGpuInstanceCreateComputeInstance(
        self, gpu_instance: Any, profile_id: int, /
    ) -> Any: ...
    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: Any, profile_id: int, buffer: Any, count: Any, /
    ) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: Any, ci_id: int, /) -> Any: ...
    def nvmlComputeInstanceGetInfo(self, compute_instance: Any, /) -> Any: ...
    def nvmlComputeInstanceDestroy(self, compute_instance: Any, /) -> Any: ...
    def nvmlGpuInstanceDestroy(self, gpu_instance: Any, /) -> Any: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int, /) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetUUID(self, handle: Any, /) -> Any: ...


@record(frozen=True)
class GpuInstance:
    """A GPU instance as the GPU has it now: id, profile id, placement, and its compute
    instances' ids."""

    id: int
    profile_id: int
    start: int
    size: int
    compute_instances: tuple[int, ...] = ()

    def overlaps(self, start: int, size: int) -> bool:
        return self.start < start + size and start < self.start + self.size


@record(frozen=True)
class Cut:
    """What a cut made: the GPU instance, its compute instance and the MIG device's UUID."""

    gpu_instance: int
    compute_instance: int
    uuid: str


class MigControl:
    """MIG layout changes on the GPUs of one `Nvml`, serialized per GPU."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextmanager
    def gpu(self, uuid: str) -> Iterator[None]:
        """Hold GPU `uuid` for a sequence of calls."""
        with self._guard:
            lock = self._locks.setdefault(uuid, threading.Lock())
        with lock:
            yield

    def mig_mode(self, uuid: str) -> tuple[int, int]:
        """(current, pending) MIG mode."""
        with self._calls(f"{uuid}: reading its MIG mode") as nvml:
            current, pending = nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByUUID(uuid))
            return int(current), int(pending)

    def set_mig_mode(self, uuid: str, mode: int) -> None:
        with self._calls(f"{uuid}: setting its MIG mode to {mode}") as nvml:
            nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByUUID(uuid), mode)

    def gpu_instances(self, uuid: str) -> list[GpuInstance]:
        """Every GPU instance on the GPU, by id; none while its MIG mode is off (NVML refuses
        to list them then)."""
        found = []
        with self._calls(f"{uuid}: listing its GPU instances") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            if int(nvml.nvmlDeviceGetMigMode(handle)[0]) == 0:
                return []
            for profile_id, count in _gi_profiles(nvml, handle):
                buffer = (nvml.c_nvmlGpuInstance_t * count)()
                got = ctypes.c_uint(count)
                nvml.nvmlDeviceGetGpuInstances(handle, profile_id, buffer, ctypes.byref(got))
                for gpu_instance in buffer[: got.value]:
                    info = nvml.nvmlGpuInstanceGetInfo(gpu_instance)
                    found.append(
                        GpuInstance(
                            id=int(info.id),
                            profile_id=int(info.profileId),
                            start=int(info.placement.start),
                            size=int(info.placement.size),
                            compute_instances=_ci_ids(nvml, gpu_instance),
                        )
                    )
        return sorted(found, key=lambda g: g.id)

    def create_gpu_instance(self, uuid: str, profile_id: int, start: int, size: int) -> int:
        """A GPU instance of `profile_id` at the placement; its id."""
        where = f"{uuid}: creating a GPU instance of profile {profile_id} at {start}+{size}"
        with self._calls(where) as nvml:
            placement = nvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, size
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, profile_id, ctypes.pointer(placement)
            )
            return int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).id)

    def create_compute_instance(self, uuid: str, gpu_instance_id: int) -> Cut:
        """The full-size compute instance of the GPU instance (the compute profile with the most
        slices it offers), and the MIG device it makes."""
        where = f"{uuid}: creating the compute instance of GPU instance {gpu_instance_id}"
        with self._calls(where) as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            profile = _full_compute_profile(nvml, gpu_instance)
            compute = nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, profile)
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(compute).id)
            return Cut(gpu_instance_id, ci_id, _mig_uuid(nvml, handle, gpu_instance_id, ci_id))

    def destroy(self, uuid: str, gpu_instance_id: int, compute_instances: tuple[int, ...]) -> None:
        """The compute instances, then the GPU instance; one already gone (NOT_FOUND) counts
        as destroyed."""
        where = f"{uuid}: destroying GPU instance {gpu_instance_id}"
        with self._calls(where) as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            try:
                gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            except nvml.NVMLError as err:
                if getattr(err, "value", None) in (ERROR_NOT_FOUND, ERROR_INVALID_ARGUMENT):
                    return
                raise
            for ci_id in compute_instances:
                try:
                    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id)
                    nvml.nvmlComputeInstanceDestroy(ci)
                except nvml.NVMLError as err:
                    if getattr(err, "value", None) not in (ERROR_NOT_FOUND, ERROR_INVALID_ARGUMENT):
                        raise
            nvml.nvmlGpuInstanceDestroy(gpu_instance)

    @contextmanager
    def _calls(self, context: str) -> Iterator[MigModule]:
        """The module, its errors translated; a module without the calls (the Python fake)
        answers NOT_SUPPORTED."""
        module = cast(MigModule, self._nvml.module)
        if not hasattr(module, "nvmlDeviceCreateGpuInstanceWithPlacement"):
            raise NvmlError(
                f"{context}: this NVML cannot change MIG layouts (the --simulate node; use a "
                "sim-root driver root)",
                ERROR_NOT_SUPPORTED,
            )
        with self._nvml.errors(context):
            yield module


def _gi_profiles(nvml: MigModule, handle: Any) -> Iterator[tuple[int, int]]:
    """(profile id, most instances) of each GPU-instance profile the GPU offers."""
    seen = set()
    for enum in range(_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        except nvml.NVMLError as err:
            if getattr(err, "value", None) in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                continue
            raise
        if int(info.id) not in seen and int(info.instanceCount) > 0:
            seen.add(int(info.id))
            yield int(info.id), int(info.instanceCount)


def _compute_profiles(nvml: MigModule, gpu_instance: Any) -> Iterator[Any]:
    for enum in range(_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            yield nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance, enum, _ENGINE_SHARED
            )
        except nvml.NVMLError as err:
            if getattr(err, "value", None) not in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                raise


def _full_compute_profile(nvml: MigModule, gpu_instance: Any) -> int:
    """The id of the compute profile spanning the most slices of the GPU instance."""
    best = max(_compute_profiles(nvml, gpu_instance), key=lambda i: int(i.sliceCount), default=None)
    if best is None:
        raise NvmlError("the GPU instance offers no compute-instance profile", ERROR_NOT_SUPPORTED)
    return int(best.id)


def _ci_ids(nvml: MigModule, gpu_instance: Any) -> tuple[int, ...]:
    found = set()
    for info in _compute_profiles(nvml, gpu_instance):
        buffer = (nvml.c_nvmlComputeInstance_t * _MAX_COMPUTE_INSTANCES)()
        got = ctypes.c_uint(_MAX_COMPUTE_INSTANCES)
        nvml.nvmlGpuInstanceGetComputeInstances(
            gpu_instance, int(info.id), buffer, ctypes.byref(got)
        )
        found |= {int(nvml.nvmlComputeInstanceGetInfo(ci).id) for ci in buffer[: got.value]}
    return tuple(sorted(found))


def _mig_uuid(nvml: MigModule, handle: Any, gi_id: int, ci_id: int) -> str:
    """The UUID of the MIG device of (GPU instance, compute instance), found among the GPU's
    MIG devices as NVIDIA's driver finds it."""
    for index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == ERROR_NOT_FOUND:
                continue
            raise
        if (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)) == (
            gi_id,
            ci_id,
        ):
            uuid = nvml.nvmlDeviceGetUUID(mig)
            return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    raise NvmlError(f"no MIG device has GPU instance {gi_id} and compute instance {ci_id}")
