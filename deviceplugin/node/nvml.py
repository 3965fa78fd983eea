"""The only module that imports `pynvml`: the NVML calls the plugin makes, NVML errors translated
into `deviceplugin.model.errors` in one place, and the event-set wait used by the health monitor.

`Nvml` wraps any module with pynvml's API (`nvml_api.NvmlModule`): the real `pynvml`, or the
simulator (`deviceplugin.sim.fake_nvml.FakeNvml`), which has the same functions and the same
NVMLError return codes.
Errors are told apart by code (`err.value`), never by class, so both behave the same.
With a driver root other than `/`, the real module is bound to the `libnvidia-ml.so.1` found
under that root, as the reference plugin resolves it (`driver_library`).
Reads return plain values (`GpuInfo`, `MigInfo`, `NvLink`); turning them into the device
model — profile names, NUMA, links — is discovery's job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from deviceplugin.model.errors import GpuLostError, NvmlError
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.node.nvml_api import NvmlModule, ProfileInfo

logger = logging.getLogger(__name__)

EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_SINGLE_BIT_ECC = 0x1
UNMONITORED = "unmonitored"  # prefix of an event_set reason that is not an error

# NVML return codes and constants (part of the C ABI, identical in every NVML release).
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
_ERROR_OPERATING_SYSTEM = 17
MEMORY_LIMIT_MAX = (1 << 64) - 1  # NVML_DEVICE_MEMORY_LIMIT_MAX: no limit
_SUCCESS = 0
_MIG_ENABLE = 1
_NVLINK_MAX_LINKS = 36  # links past a GPU's own count answer an error and are skipped
_NVLINK_DEVICE_TYPE_SWITCH = 2
_GPU_INSTANCE_PROFILE_COUNT = 0x12
_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
_NO_INSTANCE = 0xFFFFFFFF

NumaReader = Callable[[str], "int | None"]
_T = TypeVar("_T")
_Info = TypeVar("_Info", bound=ProfileInfo)


@record(frozen=True)
class NvmlEvent:
    """One NVML event, decoded. Instance IDs are None when NVML reports 0xFFFFFFFF."""

    gpu_uuid: str
    event_type: int
    xid: int  # eventData: the Xid number (999 when NVML does not know it)
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@record(frozen=True)
class Probe:
    """What NVML says about a GPU when the health monitor checks whether it has recovered."""

    answers: bool  # basic queries succeed
    lost: bool  # NVML_ERROR_GPU_IS_LOST
    retired_pages_pending: bool = False
    remapped_rows_pending: bool = False
    recovery_action: int | None = None  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; None: not exposed


@record(frozen=True)
class GpuInfo:
    """What NVML reports about one physical GPU."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    minor: int
    pci_bus_id: str
    compute_capability: tuple[int, int]
    mig_capable: bool
    mig_enabled: bool


@record(frozen=True)
class MigInfo:
    """What NVML reports about one MIG device. Slice counts come from the GPU- and
    compute-instance profiles (as go-nvlib reads them), memory from the device attributes."""

    index: int
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    gpu_instance_profile: int  # NVML_GPU_INSTANCE_PROFILE_* enum (tells +me, +gfx, -me apart)
    gpu_slices: int
    compute_slices: int
    memory_mib: int


@record(frozen=True)
class GiProfileInfo:
    """One GPU-instance profile a MIG-capable GPU offers (NVML's profile info) and the
    placements NVML allows its instances (GetGpuInstancePossiblePlacements)."""

    enum: int  # NVML_GPU_INSTANCE_PROFILE_* (tells +me, +gfx, -me apart)
    id: int
    slices: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices


@record(frozen=True)
class NvLink:
    """One active NVLink of a GPU: where it ends."""

    remote_pci_bus_id: str
    to_switch: bool


def _error(err: Exception, context: str) -> NvmlError:
    """The one place an NVML error becomes ours: by return code, for pynvml and the simulator."""
    code = getattr(err, "value", None)
    message = f"{context}: {err}"
    if code == ERROR_GPU_IS_LOST:
        return GpuLostError(message, code)
    return NvmlError(message, code if isinstance(code, int) else None)


class _Translated:
    """The block of `Nvml.errors`: a plain context manager, as it wraps every NVML call (a
    generator-based one costs several times as much to enter and leave)."""

    __slots__ = ("_context", "_nvml_error")

    def __init__(self, nvml_error: type[Exception], context: str) -> None:
        self._nvml_error = nvml_error
        self._context = context

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if err is not None and isinstance(err, self._nvml_error):
            raise _error(err, self._context) from err


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _handle_key(handle: Any) -> Hashable:
    """A hashable identity for a device handle: ctypes pointers compare by object, so use the
    address NVML gave; the simulator's handles are values already."""
    import ctypes  # pynvml loads it anyway; a simulated node first asks here, once registering

    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    key: Hashable = handle
    return key


class EventSet:
    """NVML events registered on every GPU; `wait` blocks at most `timeout_ms`.

    Call `wait` from one thread at a time, and `close` once no wait is running."""

    def __init__(self, nvml: Nvml, raw: Any, uuids: dict[Hashable, str]) -> None:
        self._nvml = nvml
        self._raw = raw
        self._uuids = uuids

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        """The next event, or None on timeout. Raises GpuLostError / NvmlError on failure."""
        module = self._nvml.module
        try:
            data = module.nvmlEventSetWait_v2(self._raw, timeout_ms)
        except module.NVMLError as err:
            if getattr(err, "value", None) == ERROR_TIMEOUT:
                return None
            raise _error(err, "waiting for NVML events") from err
        uuid = self._uuids.get(_handle_key(data.device))
        if uuid is None:
            with self._nvml.errors("reading the UUID of an event's GPU"):
                uuid = _text(module.nvmlDeviceGetUUID(data.device))
        return NvmlEvent(
            gpu_uuid=uuid,
            event_type=int(data.eventType),
            xid=int(data.eventData),
            gpu_instance_id=_instance_id(data.gpuInstanceId),
            compute_instance_id=_instance_id(data.computeInstanceId),
        )

    def close(self) -> None:
        with self._nvml.errors("freeing the NVML event set"):
            self._nvml.module.nvmlEventSetFree(self._raw)


def _instance_id(value: int) -> int | None:
    return None if value == _NO_INSTANCE else int(value)


class Nvml:
    """NVML bound to a pynvml-compatible module (the real one or the simulator).

    `numa_reader`, when given, maps a GPU's PCI bus id to its NUMA node instead of NVML and
    sysfs (the simulator supplies its node file's `numaNode`). `library`, for the real module:
    the libnvidia-ml file `init()` binds pynvml to (None: the loader's search by soname)."""

    def __init__(
        self,
        module: NvmlModule,
        numa_reader: NumaReader | None = None,
        library: str | None = None,
    ) -> None:
        self._nvml = module
        self.numa_reader = numa_reader
        self.library = library

    @property
    def module(self) -> NvmlModule:
        return self._nvml

    def errors(self, context: str) -> _Translated:
        """Translate NVML errors raised inside the block; `context` says what was being done."""
        return _Translated(self._nvml.NVMLError, context)

    def init(self) -> None:
        if getattr(self._nvml, "__name__", None) == "pynvml":  # the real module, not the fake
            _bind_library(self._nvml, self.library)
        with self.errors("initialising NVML"):
            self._nvml.nvmlInit()

    def shutdown(self) -> None:
        with self.errors("shutting NVML down"):
            self._nvml.nvmlShutdown()

    # --- discovery reads ----------------------------------------------------------------------

    def driver_version(self) -> str:
        with self.errors("reading the driver version"):
            return _text(self._nvml.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> int:
        with self.errors("reading the CUDA driver version"):
            return int(self._nvml.nvmlSystemGetCudaDriverVersion())

    def gpu_count(self) -> int:
        with self.errors("counting GPUs"):
            return int(self._nvml.nvmlDeviceGetCount())

    def _handle(self, index: int) -> Any:
        with self.errors(f"GPU {index}: getting its handle"):
            return self._nvml.nvmlDeviceGetHandleByIndex(index)

    def gpu(self, index: int) -> GpuInfo:
        """The GPU at NVML index `index`. Raises GpuLostError when it has fallen off the bus."""
        nvml, handle = self._nvml, self._handle(index)
        with self.errors(f"GPU {index}: reading its identity"):
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        with self.errors(f"GPU {index} ({uuid}): reading its properties"):
            name = _text(nvml.nvmlDeviceGetName(handle))
            memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        capable, enabled = self._mig_mode(handle, f"GPU {index} ({uuid})")
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=name,
            memory_total_bytes=memory,
            minor=minor,
            pci_bus_id=bus_id,
            compute_capability=(int(major), int(minor_cc)),
            mig_capable=capable,
            mig_enabled=enabled,
        )

    def numa_node(self, index: int, pci_bus_id: str, sysfs: NumaReader) -> int | None:
        """The GPU's NUMA node: the simulator's node file, else NVML, else (NVML cannot say:
        a driver without the call, or NOT_SUPPORTED) `sysfs`. Raises GpuLostError."""
        if self.numa_reader is not None:
            return self.numa_reader(pci_bus_id)
        handle = self._handle(index)
        try:
            return int(self._nvml.nvmlDeviceGetNumaNodeId(handle))
        except self._nvml.NVMLError as err:
            if getattr(err, "value", None) == ERROR_GPU_IS_LOST:
                raise _error(err, f"GPU {index}: reading its NUMA node") from err
        return sysfs(pci_bus_id)

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        """Put a GPU (or MIG device) in compute mode `mode` (an nvmlComputeMode_t)."""
        with self.errors(f"{uuid}: setting its compute mode to {mode}"):
            self._nvml.nvmlDeviceSetComputeMode(self._nvml.nvmlDeviceGetHandleByUUID(uuid), mode)

    def _mig_mode(self, handle: Any, where: str) -> tuple[bool, bool]:
        """(capable, enabled): a GPU or driver without MIG answers NOT_SUPPORTED / no function."""
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._nvml.NVMLError as err:
            if getattr(err, "value", None) in (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND):
                return False, False
            raise _error(err, f"{where}: reading its MIG mode") from err
        return True, current == _MIG_ENABLE

    def mig_devices(self, gpu_index: int) -> list[MigInfo]:
        """The MIG devices on a MIG-enabled GPU, in NVML index order."""
        nvml, handle = self._nvml, self._handle(gpu_index)
        where = f"GPU {gpu_index}"
        with self.errors(f"{where}: counting MIG devices"):
            count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        devices = []
        gi_profiles = _ProfileIndex()
        for mig_index in range(count):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
            except nvml.NVMLError as err:
                if getattr(err, "value", None) == ERROR_NOT_FOUND:
                    continue  # an empty slot
                raise _error(err, f"{where}: MIG device {mig_index}") from err
            with self.errors(f"{where}: MIG device {mig_index}"):
                devices.append(self._mig(handle, mig, mig_index, gi_profiles))
        return devices

    def _mig(self, parent: Any, mig: Any, index: int, gi_profiles: _ProfileIndex) -> MigInfo:
        nvml = self._nvml
        uuid = _text(nvml.nvmlDeviceGetUUID(mig))
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
        memory_mib = int(nvml.nvmlDeviceGetAttributes(mig).memorySizeMB)
        try:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == ERROR_NO_PERMISSION:
                raise NvmlError(
                    f"{uuid}: reading its GPU instance needs the MIG monitor capability "
                    f"(run with NVIDIA_MIG_MONITOR_DEVICES=all): {err}",
                    ERROR_NO_PERMISSION,
                ) from err
            raise
        gi_profile_id = int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).profileId)
        gi_enum, gpu_slices = gi_profiles.gpu_instance(nvml, parent, gi_profile_id, uuid)
        compute_instance = nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id)
        ci_profile_id = int(nvml.nvmlComputeInstanceGetInfo(compute_instance).profileId)
        compute_slices = _compute_slices(nvml, gpu_instance, ci_profile_id, uuid)
        return MigInfo(
            index=index,
            uuid=uuid,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            gpu_instance_profile=gi_enum,
            gpu_slices=gpu_slices,
            compute_slices=compute_slices,
            memory_mib=memory_mib,
        )

    def gpu_instance_profiles(self, gpu_index: int) -> list[GiProfileInfo]:
        """Every GPU-instance profile the GPU offers with its possible placements, by NVML
        enum; profiles the GPU lacks, or without a placement, are left out."""
        nvml, handle = self._nvml, self._handle(gpu_index)
        found = []
        with self.errors(f"GPU {gpu_index}: reading its MIG profiles and placements"):
            for enum in range(_GPU_INSTANCE_PROFILE_COUNT):
                call = partial(nvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, enum)
                info = _profile_info(nvml, call)
                places = () if info is None else self._placements(handle, int(info.id))
                if info is None or not places:
                    continue
                found.append(
                    GiProfileInfo(
                        enum=enum,
                        id=int(info.id),
                        slices=int(info.sliceCount),
                        memory_mib=int(info.memorySizeMB),
                        multiprocessors=int(info.multiprocessorCount),
                        copy_engines=int(info.copyEngineCount),
                        decoders=int(info.decoderCount),
                        encoders=int(info.encoderCount),
                        jpegs=int(info.jpegCount),
                        ofas=int(info.ofaCount),
                        placements=places,
                    )
                )
        return found

    def _placements(self, handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
        """NVML's placements for a GPU-instance profile id: asked once for the count (a NULL
        buffer), then for the placements."""
        import ctypes  # loaded by pynvml already; the simulator takes the same arguments

        nvml = self._nvml
        count = ctypes.c_uint(0)
        call = nvml.nvmlDeviceGetGpuInstancePossiblePlacements
        try:
            call(handle, profile_id, None, ctypes.byref(count))
        except nvml.NVMLError as err:
            if getattr(err, "value", None) in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                return ()
            raise
        places = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        call(handle, profile_id, places, ctypes.byref(count))
        return tuple((int(p.start), int(p.size)) for p in places[: count.value])

    def nvlinks(self, gpu_index: int) -> list[NvLink]:
        """The GPU's active NVLinks; empty when it has none or NVML cannot tell."""
        nvml, handle = self._nvml, self._handle(gpu_index)
        links = []
        for link in range(_NVLINK_MAX_LINKS):
            with self.errors(f"GPU {gpu_index}: NVLink {link}"):
                try:
                    if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                        continue
                    remote = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
                except nvml.NVMLError as err:
                    if getattr(err, "value", None) == ERROR_GPU_IS_LOST:
                        raise
                    continue  # no such link, or NVLink not supported
                try:
                    kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                except nvml.NVMLError as err:
                    if getattr(err, "value", None) == ERROR_GPU_IS_LOST:
                        raise
                    kind = None  # older drivers: the peer's bus id still identifies a GPU
            links.append(NvLink(remote, to_switch=kind == _NVLINK_DEVICE_TYPE_SWITCH))
        return links

    def common_ancestor(self, first: int, second: int) -> int | None:
        """NVML's PCIe topology level between two GPUs; None when NVML does not say."""
        nvml = self._nvml
        a, b = self._handle(first), self._handle(second)
        with self.errors(f"GPUs {first} and {second}: PCIe topology"):
            try:
                return int(nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
            except nvml.NVMLError as err:
                if getattr(err, "value", None) == ERROR_NOT_SUPPORTED:
                    return None
                raise

    # --- health -------------------------------------------------------------------------------

    def event_set(self, gpu_uuids: list[str]) -> tuple[EventSet, dict[str, str]]:
        """Register Xid and ECC events on each GPU; also return {uuid: why} for GPUs that could
        not be registered. A reason starting with UNMONITORED is not an error (NVML does not
        support these events there): that GPU is left unmonitored and stays healthy."""
        nvml = self._nvml
        with self.errors("creating an NVML event set"):
            raw = nvml.nvmlEventSetCreate()
        uuids: dict[Hashable, str] = {}
        failed: dict[str, str] = {}
        wanted = EVENT_XID | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC
        for uuid in dict.fromkeys(gpu_uuids):
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                mask = wanted & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, raw)
            except nvml.NVMLError as err:
                if getattr(err, "value", None) == ERROR_NOT_SUPPORTED:
                    failed[uuid] = f"{UNMONITORED}: NVML events not supported on this GPU ({err})"
                else:
                    failed[uuid] = f"event registration failed: {_error(err, uuid)}"
                continue
            if not mask:
                failed[uuid] = f"{UNMONITORED}: the GPU reports none of the Xid/ECC events"
                continue
            uuids[_handle_key(handle)] = uuid
        return EventSet(self, raw, uuids), failed

    # --- per-cgroup memory limits (a memory share's cap) ---------------------------------------

    def memory_limits_supported(self, gpu_uuid: str) -> bool:
        """Whether this GPU's NVML has per-cgroup memory limits: a read of the root cgroup's
        that is refused as unsupported (or a library without the call) says no; any other
        answer (none set, the path not a cgroup) says yes."""
        nvml = self._nvml
        with self.errors(f"reading the memory limits of {gpu_uuid}"):
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            limits = nvml.c_nvmlGetMemoryLimits_v1_t()
            limits.nameSpace = b"/sys/fs/cgroup"
            try:
                nvml.nvmlDeviceGetMemoryLimits_v1(handle, limits)
            except nvml.NVMLError as err:
                code = getattr(err, "value", None)
                if code in (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND):
                    return False
                if code not in (ERROR_NOT_FOUND, _ERROR_OPERATING_SYSTEM):
                    raise
        return True

    def set_memory_limit(self, gpu_uuid: str, name_space: str, limit: int | None) -> None:
        """Limit a cgroup on a GPU to `limit` bytes (hard = soft), or clear its limit (None); a
        cgroup that is gone has none left."""
        nvml = self._nvml
        what = f"the memory limit of {name_space} on {gpu_uuid}"
        what = f"clearing {what}" if limit is None else f"setting {what} to {limit}"
        with self.errors(what):
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            limits = nvml.c_nvmlSetMemoryLimits_v1_t()
            limits.nameSpace = name_space.encode()
            limits.softLimit, limits.hardLimit = (
                (0, MEMORY_LIMIT_MAX) if limit is None else (limit, limit)
            )
            try:
                nvml.nvmlDeviceSetMemoryLimits_v1(handle, limits)
            except nvml.NVMLError as err:
                if getattr(err, "value", None) != _ERROR_OPERATING_SYSTEM:
                    raise

    def probe(self, gpu_uuid: str) -> Probe:
        """Check one GPU. NVML failures become fields of the answer, never exceptions."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as err:
            lost = getattr(err, "value", None) == ERROR_GPU_IS_LOST
            return Probe(answers=False, lost=lost)
        try:
            retired = self._optional(
                gpu_uuid, partial(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            )
            rows = self._optional(gpu_uuid, partial(nvml.nvmlDeviceGetRemappedRows, handle))
            fields = self._optional(
                gpu_uuid,
                partial(nvml.nvmlDeviceGetFieldValues, handle, [_FI_DEV_GET_GPU_RECOVERY_ACTION]),
            )
        except GpuLostError:
            return Probe(answers=False, lost=True)
        action = None
        if fields and int(fields[0].nvmlReturn) == _SUCCESS:
            action = int(fields[0].value.uiVal)
        return Probe(
            answers=True,
            lost=False,
            retired_pages_pending=bool(retired),
            remapped_rows_pending=bool(rows and rows[2]),
            recovery_action=action,
        )

    def _optional(self, gpu_uuid: str, call: partial[_T]) -> _T | None:
        """A probe query whose absence means "nothing pending": None on any error but a lost
        GPU (NOT_SUPPORTED is expected, e.g. remapped rows while MIG is enabled)."""
        try:
            return call()
        except self._nvml.NVMLError as err:
            code = getattr(err, "value", None)
            if code == ERROR_GPU_IS_LOST:
                raise _error(err, f"probing {gpu_uuid}") from err
            if code != ERROR_NOT_SUPPORTED:
                name = getattr(call.func, "__name__", "nvml")
                log_event(
                    logger,
                    "nvml.probe.failed",
                    logging.DEBUG,
                    uuid=gpu_uuid,
                    call=name,
                    error=str(err),
                )
            return None


class _ProfileIndex:
    """GPU-instance profile driver id -> (NVML enum, slices), learned once per parent GPU by
    asking for every enum's profile info (the ids are driver-internal numbers)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[int, int]] | None = None

    def gpu_instance(
        self, nvml: NvmlModule, parent: Any, profile_id: int, uuid: str
    ) -> tuple[int, int]:
        if self._by_id is None:
            self._by_id = {}
            for enum in range(_GPU_INSTANCE_PROFILE_COUNT):
                call = partial(nvml.nvmlDeviceGetGpuInstanceProfileInfo, parent, enum)
                info = _profile_info(nvml, call)
                if info is not None:
                    self._by_id.setdefault(int(info.id), (enum, int(info.sliceCount)))
        found = self._by_id.get(profile_id)
        if found is None:
            raise NvmlError(f"{uuid}: GPU-instance profile id {profile_id} matches no NVML profile")
        return found


def _compute_slices(nvml: NvmlModule, gpu_instance: Any, profile_id: int, uuid: str) -> int:
    for enum in range(_COMPUTE_INSTANCE_PROFILE_COUNT):
        call = partial(
            nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gpu_instance,
            enum,
            _COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        info = _profile_info(nvml, call)
        if info is not None and int(info.id) == profile_id:
            return int(info.sliceCount)
    raise NvmlError(f"{uuid}: compute-instance profile id {profile_id} matches no NVML profile")


def _profile_info(nvml: NvmlModule, call: partial[_Info]) -> _Info | None:
    """A profile's info, or None for profiles this GPU does not offer."""
    try:
        return call()
    except nvml.NVMLError as err:
        if getattr(err, "value", None) in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
            return None
        raise


# Where the reference plugin (v0.19.0, cmd/nvidia-device-plugin/root.go) looks under a driver
# root for the library, in order.
LIBRARY_SEARCH_DIRS = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
)
LIBRARY_SONAME = "libnvidia-ml.so.1"


def driver_library(driver_root: str) -> str | None:
    """`libnvidia-ml.so.1` under `driver_root`, symlinks resolved, from the first search dir
    that has it; None for the root `/` or when none has it (the loader's own search then)."""
    if driver_root in ("", "/"):
        return None
    for directory in LIBRARY_SEARCH_DIRS:
        candidate = os.path.join(driver_root, directory.lstrip("/"), LIBRARY_SONAME)
        if os.path.exists(candidate):
            return os.path.realpath(candidate)
    return None


def _bind_library(pynvml: Any, path: str | None) -> None:
    """Point pynvml at the library file `path` (pynvml itself loads only by soname), or with
    None back at its own load by soname."""
    with pynvml.libLoadLock:
        current = getattr(pynvml.nvmlLib, "_name", None)
        if current == (path or LIBRARY_SONAME) or (path is None and current is None):
            return
        library = None
        if path is not None:
            import ctypes  # loaded by pynvml already

            try:
                library = ctypes.CDLL(path)
            except OSError as err:
                raise NvmlError(f"loading {path}: {err}", ERROR_LIBRARY_NOT_FOUND) from err
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()


def real_nvml(driver_root: str = "/") -> Nvml:
    """The host's libnvidia-ml (the one under `driver_root` when there is one there), not
    initialised yet: call `init()`."""
    import pynvml  # here, so a simulated node never loads it

    return Nvml(pynvml, library=driver_library(driver_root))
