"""A stand-in for the `pynvml` module, built from a simulated node (see `node.py`).

`FakeNvml` answers the NVML calls the plugin makes with the same names, arguments, return
shapes and NVMLError subclasses as `pynvml`, so the plugin's NVML adapter cannot tell the two
apart. A MIG device's events arrive on its parent GPU with its GI/CI ids, as on hardware.

Live changes (see `world.py`): the node file is re-read when it changes (checked on nvmlInit
and nvmlDeviceGetCount, or on `reload()`), so a test can re-cut MIG under a running plugin;
the events file is read on every call, so a GPU marked lost fails from the next call on, and
`nvmlEventSetWait_v2` sleeps until the file is written (see `events.EventFileWatch`).

Not part of NVML: `numa_node(pci_bus_id)`, the node file's `numaNode` (a simulator cannot lay
out sysfs), and `reload()`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from deviceplugin.sim import structs as s
from deviceplugin.sim.node import SimGpu, SimMig
from deviceplugin.sim.profiles import (
    CI_ENUM,
    GiProfile,
    gpu_slices,
    instance_count,
    model_profiles,
)
from deviceplugin.sim.profiles import placements as placements_of
from deviceplugin.sim.world import SimEventSet, World

_MIB = 1 << 20
_MAX_MIG_DEVICES = 7


class FakeNvml:
    """The simulated NVML library; pass it wherever the `pynvml` module is expected."""

    NVMLError = s.NVMLError
    c_nvmlSetMemoryLimits_v1_t = s.MemoryLimits
    c_nvmlGetMemoryLimits_v1_t = s.MemoryLimits
    c_nvmlGpuInstancePlacement_t = s.c_nvmlGpuInstancePlacement_t

    def __init__(self, node: str, events_path: str | None = None) -> None:
        calls = [name for name in dir(type(self)) if name.startswith("nvml")]
        self._world = World(node, events_path, calls)
        self._lock = self._world.lock
        self._init_count = 0
        self._limits: dict[tuple[str, bytes], tuple[int, int]] = {}
        self._compute_modes: dict[str, int] = {}  # device UUID -> mode; absent: DEFAULT

    def reload(self) -> None:
        """Re-read the node file now; raises ConfigError when it is invalid."""
        self._world.reload()

    def numa_node(self, pci_bus_id: str) -> int | None:
        """The node file's `numaNode` for the GPU at this PCI address."""
        return self._world.numa_node(pci_bus_id)

    # --- plumbing -----------------------------------------------------------------------------

    def _enter(self) -> None:
        """Every NVML call starts here: library state, then any new lines of the events file."""
        if self._init_count == 0:
            raise s.NVMLError_Uninitialized()
        self._world.pump()

    def _gpu(self, handle: Any, call: str) -> SimGpu:
        """The GPU behind a GPU or MIG handle, failing as NVML would for that GPU."""
        self._enter()
        if not isinstance(handle, s.DeviceHandle):
            raise s.NVMLError_InvalidArgument()
        gpu = self._find_gpu(handle.gpu_uuid)
        if self._world.state(gpu.uuid).lost:
            raise s.NVMLError_GpuIsLost()
        if call in gpu.not_supported:
            raise s.NVMLError_NotSupported()
        return gpu

    def _whole_gpu(self, handle: Any, call: str) -> SimGpu:
        gpu = self._gpu(handle, call)
        if handle.mig_uuid is not None:
            raise s.NVMLError_InvalidArgument()
        return gpu

    def _device(self, handle: Any, call: str) -> tuple[SimGpu, SimMig | None]:
        """The GPU and, for a MIG handle, the MIG device behind a handle."""
        gpu = self._gpu(handle, call)
        if handle.mig_uuid is None:
            return gpu, None
        for mig in gpu.mig_devices:
            if mig.uuid == handle.mig_uuid:
                return gpu, mig
        raise s.NVMLError_NotFound()

    def _mig(self, handle: Any, call: str) -> tuple[SimGpu, SimMig]:
        gpu, mig = self._device(handle, call)
        if mig is None:
            raise s.NVMLError_InvalidArgument()
        return gpu, mig

    def _find_gpu(self, uuid: str) -> SimGpu:
        gpu = self._world.gpus.get(uuid)
        if gpu is None:
            raise s.NVMLError_NotFound()
        return gpu

    # --- library and system -------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self._world.reload_if_changed()
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count == 0:
                raise s.NVMLError_Uninitialized()
            self._init_count -= 1
            idle = self._init_count == 0
        if idle:
            self._world.stop_watching()

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._lock:
            self._enter()
            return self._world.node.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        with self._lock:
            self._enter()
            return self._world.node.cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion()

    # --- device handles -----------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._enter()
            self._world.reload_if_changed()
            return len(self._world.node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> s.DeviceHandle:
        with self._lock:
            self._enter()
            if not 0 <= index < len(self._world.node.gpus):
                raise s.NVMLError_InvalidArgument()
            gpu = self._world.node.gpus[index]
            if self._world.state(gpu.uuid).lost:
                raise s.NVMLError_GpuIsLost()
            return s.DeviceHandle(gpu.uuid)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> s.DeviceHandle:
        with self._lock:
            self._enter()
            text = uuid.decode() if isinstance(uuid, bytes) else uuid
            owner = self._world.owner(text)
            if owner is None:
                raise s.NVMLError_NotFound()
            gpu, mig = owner
            if self._world.state(gpu.uuid).lost:
                raise s.NVMLError_GpuIsLost()
            return s.DeviceHandle(gpu.uuid, mig.uuid if mig else None)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        with self._lock:
            return self._whole_gpu(handle, "nvmlDeviceGetIndex").index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        with self._lock:
            gpu = self._gpu(handle, "nvmlDeviceGetUUID")
            return str(handle.mig_uuid or gpu.uuid)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        with self._lock:
            gpu, mig = self._device(handle, "nvmlDeviceGetName")
            return gpu.name if mig is None else f"{gpu.name} MIG {mig.profile}"

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> s.Memory:
        with self._lock:
            gpu, mig = self._device(handle, "nvmlDeviceGetMemoryInfo")
            mib = gpu.memory_mib if mig is None else mig.shape.gpu_instance.memory_mib
            return s.Memory(total=mib * _MIB, free=mib * _MIB, used=0)

    def nvmlDeviceSetMemoryLimits_v1(self, handle: Any, limits: s.MemoryLimits) -> None:
        """Kept per (GPU, cgroup path) for GetMemoryLimits_v1; MIG handles are refused. The C
        library (limits.c) also checks the cgroup and the values; the fake keeps only this."""
        with self._lock:
            gpu = self._limited(handle, "nvmlDeviceSetMemoryLimits_v1")
            key = (gpu.uuid, limits.nameSpace)
            if limits.softLimit == 0 and limits.hardLimit == (1 << 64) - 1:
                self._limits.pop(key, None)
            else:
                self._limits[key] = (limits.softLimit, limits.hardLimit)

    def nvmlDeviceGetMemoryLimits_v1(self, handle: Any, limits: s.MemoryLimits) -> None:
        with self._lock:
            gpu = self._limited(handle, "nvmlDeviceGetMemoryLimits_v1")
            found = self._limits.get((gpu.uuid, limits.nameSpace))
            if found is None:
                raise s.NVMLError_NotFound()
            limits.softLimit, limits.hardLimit = found

    def _limited(self, handle: Any, call: str) -> SimGpu:
        gpu = self._gpu(handle, call)
        if handle.mig_uuid is not None:
            raise s.NVMLError_NotSupported()
        return gpu

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        with self._lock:
            return self._whole_gpu(handle, "nvmlDeviceGetMinorNumber").minor

    def nvmlDeviceGetPciInfo(self, handle: Any) -> s.PciInfo:
        with self._lock:
            return _pci_info(self._gpu(handle, "nvmlDeviceGetPciInfo").pci_bus_id)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        with self._lock:
            return self._gpu(handle, "nvmlDeviceGetCudaComputeCapability").compute_capability

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        with self._lock:
            numa = self._gpu(handle, "nvmlDeviceGetNumaNodeId").numa_node
            if numa is None:
                raise s.NVMLError_NotSupported()
            return numa

    # --- MIG ----------------------------------------------------------------------------------

    def _mig_gpu(self, handle: Any, call: str, enabled: bool = True) -> SimGpu:
        gpu = self._whole_gpu(handle, call)
        if not gpu.mig_capable:
            raise s.NVMLError_NotSupported()
        if enabled and not gpu.mig_enabled:
            raise s.NVMLError_InvalidArgument()
        return gpu

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        """This process's own modes (the C library shares them across processes)."""
        with self._lock:
            uuid = self._compute_mode_device(handle, "nvmlDeviceSetComputeMode")
            valid = (
                s.NVML_COMPUTEMODE_DEFAULT,
                s.NVML_COMPUTEMODE_PROHIBITED,
                s.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
            )
            if mode not in valid:
                raise s.NVMLError_InvalidArgument()
            self._compute_modes[uuid] = mode

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        with self._lock:
            uuid = self._compute_mode_device(handle, "nvmlDeviceGetComputeMode")
            return self._compute_modes.get(uuid, s.NVML_COMPUTEMODE_DEFAULT)

    def _compute_mode_device(self, handle: Any, call: str) -> str:
        """A MIG-enabled GPU's mode is its MIG devices' (NVML's rule)."""
        gpu, mig = self._device(handle, call)
        if mig is None and gpu.mig_enabled:
            raise s.NVMLError_InvalidArgument()
        return mig.uuid if mig else gpu.uuid

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        with self._lock:
            gpu = self._mig_gpu(handle, "nvmlDeviceGetMigMode", enabled=False)
            mode = s.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else s.NVML_DEVICE_MIG_DISABLE
            return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        with self._lock:
            gpu = self._mig_gpu(handle, "nvmlDeviceGetMaxMigDeviceCount", enabled=False)
            return max(_MAX_MIG_DEVICES, len(gpu.mig_devices))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> s.DeviceHandle:
        with self._lock:
            gpu = self._mig_gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
            if 0 <= index < len(gpu.mig_devices):
                return s.DeviceHandle(gpu.uuid, gpu.mig_devices[index].uuid)
            if 0 <= index < max(_MAX_MIG_DEVICES, len(gpu.mig_devices)):
                raise s.NVMLError_NotFound()
            raise s.NVMLError_InvalidArgument()

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> s.DeviceHandle:
        with self._lock:
            gpu, _ = self._mig(handle, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
            return s.DeviceHandle(gpu.uuid)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> int:
        with self._lock:
            self._gpu(handle, "nvmlDeviceIsMigDeviceHandle")
            return int(handle.mig_uuid is not None)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        with self._lock:
            return self._mig(handle, "nvmlDeviceGetGpuInstanceId")[1].gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        with self._lock:
            return self._mig(handle, "nvmlDeviceGetComputeInstanceId")[1].compute_instance_id

    def nvmlDeviceGetAttributes(self, handle: Any) -> s.DeviceAttributes:
        with self._lock:
            _, mig = self._device(handle, "nvmlDeviceGetAttributes")
            if mig is None:
                raise s.NVMLError_NotSupported()  # NVML answers this for MIG devices only
            gi = mig.shape.gpu_instance
            return s.DeviceAttributes(
                multiprocessorCount=mig.shape.multiprocessors,
                sharedCopyEngineCount=gi.slices,
                sharedDecoderCount=gi.decoders,
                sharedEncoderCount=0,
                sharedJpegCount=gi.jpegs,
                sharedOfaCount=gi.ofas,
                gpuInstanceSliceCount=gi.slices,
                computeInstanceSliceCount=mig.shape.compute_slices,
                memorySizeMB=gi.memory_mib,
            )

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Any, profile: int, version: int = 2
    ) -> s.GpuInstanceProfileInfo:
        with self._lock:
            gpu = self._mig_gpu(handle, "nvmlDeviceGetGpuInstanceProfileInfo", enabled=False)
            if not 0 <= profile < s.NVML_GPU_INSTANCE_PROFILE_COUNT:
                raise s.NVMLError_InvalidArgument()
            profiles = gpu_instance_profiles(gpu)
            gi = profiles.get(profile)
            if gi is None:
                raise s.NVMLError_NotSupported()
            return s.GpuInstanceProfileInfo(
                id=gi.id,
                sliceCount=gi.slices,
                instanceCount=instance_count(gi, gpu_slices(profiles)),
                multiprocessorCount=gi.multiprocessors,
                decoderCount=gi.decoders,
                jpegCount=gi.jpegs,
                ofaCount=gi.ofas,
                memorySizeMB=gi.memory_mib,
                copyEngineCount=gi.slices,  # as the simulated C library reports them
            )

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, placements: Any, count: Any
    ) -> int:
        """pynvml's low-level form: `count` a ctypes.byref(c_uint); `placements` None (the
        count alone) or an array of c_nvmlGpuInstancePlacement_t filled up to `count`."""
        with self._lock:
            gpu = self._mig_gpu(handle, "nvmlDeviceGetGpuInstancePossiblePlacements", enabled=False)
            profiles = gpu_instance_profiles(gpu)
            gi = next((p for p in profiles.values() if p.id == profile_id), None)
            if gi is None:
                raise s.NVMLError_NotFound()
            places = placements_of(gi, gpu_slices(profiles))
            counter = count._obj
            if placements is not None:
                if counter.value < len(places):
                    raise s.NVMLError_InsufficientSize()
                for slot, (start, size) in zip(placements, places, strict=False):
                    slot.start, slot.size = start, size
            counter.value = len(places)
            return s.NVML_SUCCESS

    def _instance(self, gpu: SimGpu, gpu_instance_id: int) -> SimMig:
        for mig in gpu.mig_devices:
            if mig.gpu_instance_id == gpu_instance_id:
                return mig
        raise s.NVMLError_NotFound()

    def nvmlDeviceGetGpuInstanceById(
        self, handle: Any, gpu_instance_id: int
    ) -> s.GpuInstanceHandle:
        with self._lock:
            gpu = self._mig_gpu(handle, "nvmlDeviceGetGpuInstanceById")
            self._instance(gpu, gpu_instance_id)
            return s.GpuInstanceHandle(gpu.uuid, gpu_instance_id)

    def _gi(self, handle: Any, call: str) -> tuple[SimGpu, SimMig]:
        if not isinstance(handle, s.GpuInstanceHandle):
            raise s.NVMLError_InvalidArgument()
        gpu = self._mig_gpu(s.DeviceHandle(handle.gpu_uuid), call)
        return gpu, self._instance(gpu, handle.gpu_instance_id)

    def nvmlGpuInstanceGetInfo(self, handle: Any) -> s.GpuInstanceInfo:
        with self._lock:
            gpu, mig = self._gi(handle, "nvmlGpuInstanceGetInfo")
            return s.GpuInstanceInfo(
                device=s.DeviceHandle(gpu.uuid),
                id=mig.gpu_instance_id,
                profileId=mig.shape.gpu_instance.id,
            )

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, handle: Any, profile: int, eng_profile: int, version: int = 2
    ) -> s.ComputeInstanceProfileInfo:
        with self._lock:
            _, mig = self._gi(handle, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
            if not 0 <= profile < s.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
                raise s.NVMLError_InvalidArgument()
            slices = {enum: count for count, enum in CI_ENUM.items()}.get(profile)
            gi = mig.shape.gpu_instance
            if slices is None or slices > gi.slices:
                raise s.NVMLError_NotSupported()
            if eng_profile != s.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
                raise s.NVMLError_InvalidArgument()
            return s.ComputeInstanceProfileInfo(
                id=profile,
                sliceCount=slices,
                instanceCount=gi.slices // slices,
                multiprocessorCount=gi.multiprocessors * slices // gi.slices,
            )

    def nvmlGpuInstanceGetComputeInstanceById(
        self, handle: Any, compute_instance_id: int
    ) -> s.ComputeInstanceHandle:
        with self._lock:
            gpu, _ = self._gi(handle, "nvmlGpuInstanceGetComputeInstanceById")
            self._ci(gpu, handle.gpu_instance_id, compute_instance_id)
            return s.ComputeInstanceHandle(gpu.uuid, handle.gpu_instance_id, compute_instance_id)

    def _ci(self, gpu: SimGpu, gpu_instance_id: int, compute_instance_id: int) -> SimMig:
        for mig in gpu.mig_devices:
            if (mig.gpu_instance_id, mig.compute_instance_id) == (
                gpu_instance_id,
                compute_instance_id,
            ):
                return mig
        raise s.NVMLError_NotFound()

    def nvmlComputeInstanceGetInfo(self, handle: Any) -> s.ComputeInstanceInfo:
        with self._lock:
            if not isinstance(handle, s.ComputeInstanceHandle):
                raise s.NVMLError_InvalidArgument()
            gpu = self._mig_gpu(s.DeviceHandle(handle.gpu_uuid), "nvmlComputeInstanceGetInfo")
            mig = self._ci(gpu, handle.gpu_instance_id, handle.compute_instance_id)
            return s.ComputeInstanceInfo(
                device=s.DeviceHandle(gpu.uuid),
                gpuInstance=s.GpuInstanceHandle(gpu.uuid, mig.gpu_instance_id),
                id=mig.compute_instance_id,
                profileId=mig.shape.compute_profile,
            )

    # --- topology -----------------------------------------------------------------------------

    def _links(self, handle: Any, link: int, call: str) -> tuple[SimGpu, int]:
        """The GPU and how many active NVLinks it has; NVML's errors for a bad link number."""
        gpu = self._whole_gpu(handle, call)
        active = len(gpu.nvlink_peers) + gpu.nvswitch_links
        if active == 0:
            raise s.NVMLError_NotSupported()
        if not 0 <= link < s.NVML_NVLINK_MAX_LINKS:
            raise s.NVMLError_InvalidArgument()
        return gpu, active

    def _remote(self, handle: Any, link: int, call: str) -> SimGpu | None:
        """The GPU at the far end of active link `link`; None when it is an NVSwitch."""
        gpu, active = self._links(handle, link, call)
        if link >= active:
            raise s.NVMLError_NotSupported()
        if link < len(gpu.nvlink_peers):
            return self._world.node.gpus[gpu.nvlink_peers[link]]
        return None

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        with self._lock:
            _, active = self._links(handle, link, "nvmlDeviceGetNvLinkState")
            return s.NVML_FEATURE_ENABLED if link < active else s.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> s.PciInfo:
        with self._lock:
            peer = self._remote(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo")
            if peer is not None:
                return _pci_info(peer.pci_bus_id)
            return _pci_info(switch_bus_id(link))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        with self._lock:
            peer = self._remote(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
            if peer is None:
                return s.NVML_NVLINK_DEVICE_TYPE_SWITCH
            return s.NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetTopologyCommonAncestor(self, first: Any, second: Any) -> int:
        with self._lock:
            a = self._whole_gpu(first, "nvmlDeviceGetTopologyCommonAncestor")
            b = self._whole_gpu(second, "nvmlDeviceGetTopologyCommonAncestor")
            return common_ancestor(a, b)

    # --- events -------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> SimEventSet:
        with self._lock:
            self._enter()
            event_set = SimEventSet()
            self._world.event_sets.append(event_set)
            return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        with self._lock:
            return self._whole_gpu(handle, "nvmlDeviceGetSupportedEventTypes").supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        with self._lock:
            gpu = self._whole_gpu(handle, "nvmlDeviceRegisterEvents")
            if not isinstance(event_set, SimEventSet) or event_set.freed:
                raise s.NVMLError_InvalidArgument()
            if event_types & ~gpu.supported_events:
                raise s.NVMLError_NotSupported()
            event_set.masks[gpu.uuid] = event_set.masks.get(gpu.uuid, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: Any, timeoutms: int) -> s.EventData:
        """Blocks up to `timeoutms`, woken when a line is appended to the events file."""
        deadline = time.monotonic() + timeoutms / 1000
        self._world.watch_events()
        while True:
            with self._lock:
                self._enter()
                if not isinstance(event_set, SimEventSet) or event_set.freed:
                    raise s.NVMLError_InvalidArgument()
                if event_set.wait_error is not None:
                    code, event_set.wait_error = event_set.wait_error, None
                    raise s.NVMLError(code)
                if event_set.queue:
                    return event_set.queue.popleft()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise s.NVMLError_Timeout()
            self._world.wait_for_lines(remaining)

    def nvmlEventSetWait(self, event_set: Any, timeoutms: int) -> s.EventData:
        return self.nvmlEventSetWait_v2(event_set, timeoutms)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        with self._lock:
            self._enter()
            if not isinstance(event_set, SimEventSet) or event_set.freed:
                raise s.NVMLError_InvalidArgument()
            event_set.freed = True
            self._world.event_sets.remove(event_set)
            idle = not self._world.event_sets
        if idle:
            self._world.stop_watching()

    # --- health probes ------------------------------------------------------------------------

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        with self._lock:
            gpu = self._whole_gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
            return int(self._world.state(gpu.uuid).retired_pages_pending)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        with self._lock:
            gpu = self._whole_gpu(handle, "nvmlDeviceGetRemappedRows")
            pending = int(self._world.state(gpu.uuid).remapped_rows_pending)
            return (0, pending, pending, 0)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int]) -> list[s.FieldValue]:
        with self._lock:
            gpu = self._whole_gpu(handle, "nvmlDeviceGetFieldValues")
            action = self._world.state(gpu.uuid).recovery_action
            values = []
            for field_id in field_ids:
                if field_id == s.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                    values.append(s.FieldValue(field_id, s.NVML_SUCCESS, value=s.Value(action)))
                else:
                    values.append(s.FieldValue(field_id, s.NVML_ERROR_NOT_SUPPORTED))
            return values


def _pci_info(bus_id: str) -> s.PciInfo:
    domain, bus, rest = bus_id.split(":")
    return s.PciInfo(
        busId=bus_id.encode(),
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(rest.split(".")[0], 16),
    )


def gpu_instance_profiles(gpu: SimGpu) -> dict[int, GiProfile]:
    """The GPU-instance profiles a GPU offers, by NVML enum: its model's, plus those of its
    MIG devices (a model without a published table offers what its node file uses)."""
    profiles = model_profiles(gpu.name)
    for mig in gpu.mig_devices:
        profiles.setdefault(mig.shape.gpu_instance.enum, mig.shape.gpu_instance)
    return dict(sorted(profiles.items()))


def switch_bus_id(link: int) -> str:
    """The PCI bus id of the NVSwitch at the far end of NVLink `link` (six switches)."""
    return f"00000000:{0xC0 + link % 6:02X}:00.0"


def common_ancestor(a: SimGpu, b: SimGpu) -> int:
    """NVML's topology level from the node file's PCIe tree (see node.py); a GPU with itself
    is INTERNAL."""
    if a.uuid == b.uuid:
        return s.NVML_TOPOLOGY_INTERNAL
    if a.pcie_switches and a.pcie_switches[:1] == b.pcie_switches[:1]:
        if a.pcie_switches[-1] == b.pcie_switches[-1]:
            return s.NVML_TOPOLOGY_SINGLE
        return s.NVML_TOPOLOGY_MULTIPLE
    if a.host_bridge is not None and a.host_bridge == b.host_bridge:
        return s.NVML_TOPOLOGY_HOSTBRIDGE
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return s.NVML_TOPOLOGY_NODE
    return s.NVML_TOPOLOGY_SYSTEM


# pynvml's constants and NVMLError_* classes, reachable on the instance as on the module.
for _name in dir(s):
    if _name.startswith(("NVML", "nvmlEventType")):
        setattr(FakeNvml, _name, getattr(s, _name))
