"""The values the simulated NVML hands back: return codes, the NVMLError tree, constants, structs
and handles, named and numbered exactly as in `pynvml`.

Code written against `pynvml` (`except NVMLError`, `err.value == NVML_ERROR_GPU_IS_LOST`,
`info.busId`, `data.eventType`) therefore runs unchanged on the simulator. Structs carry the
fields the plugin reads plus a few neighbours, with the same types (`busId` is bytes, as a
ctypes char array is). Handles are small immutable values, equal when they name the same device.
"""

from __future__ import annotations

import ctypes
from dataclasses import field
from typing import Any, ClassVar

from deviceplugin.model.record import record

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
# nvmlComputeMode_t (EXCLUSIVE_THREAD, 1, is gone)
NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_VALUE_TYPE_UNSIGNED_INT = 1

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypeNone = 0x0


class NVMLError(Exception):
    """Mirror of `pynvml.NVMLError`: `value` is the NVML return code; `NVMLError(code)` builds
    the subclass for that code, as pynvml does."""

    code: ClassVar[int] = NVML_ERROR_UNKNOWN
    by_code: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int | None = None) -> NVMLError:
        if cls is NVMLError and value is not None:
            cls = NVMLError.by_code.get(value, NVMLError)
        error = Exception.__new__(cls)
        error.value = cls.code if value is None else value
        return error

    def __init_subclass__(cls) -> None:
        NVMLError.by_code[cls.code] = cls

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_Uninitialized(NVMLError):
    code = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(NVMLError):
    code = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):
    code = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NoPermission(NVMLError):
    code = NVML_ERROR_NO_PERMISSION


class NVMLError_AlreadyInitialized(NVMLError):
    code = NVML_ERROR_ALREADY_INITIALIZED


class NVMLError_NotFound(NVMLError):
    code = NVML_ERROR_NOT_FOUND


class NVMLError_InsufficientSize(NVMLError):
    code = NVML_ERROR_INSUFFICIENT_SIZE


class NVMLError_InsufficientPower(NVMLError):
    code = NVML_ERROR_INSUFFICIENT_POWER


class NVMLError_DriverNotLoaded(NVMLError):
    code = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_Timeout(NVMLError):
    code = NVML_ERROR_TIMEOUT


class NVMLError_IrqIssue(NVMLError):
    code = NVML_ERROR_IRQ_ISSUE


class NVMLError_LibraryNotFound(NVMLError):
    code = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_FunctionNotFound(NVMLError):
    code = NVML_ERROR_FUNCTION_NOT_FOUND


class NVMLError_CorruptedInforom(NVMLError):
    code = NVML_ERROR_CORRUPTED_INFOROM


class NVMLError_GpuIsLost(NVMLError):
    code = NVML_ERROR_GPU_IS_LOST


class NVMLError_ResetRequired(NVMLError):
    code = NVML_ERROR_RESET_REQUIRED


class NVMLError_OperatingSystem(NVMLError):
    code = NVML_ERROR_OPERATING_SYSTEM


class NVMLError_LibRmVersionMismatch(NVMLError):
    code = NVML_ERROR_LIB_RM_VERSION_MISMATCH


class NVMLError_InUse(NVMLError):
    code = NVML_ERROR_IN_USE


class NVMLError_Memory(NVMLError):
    code = NVML_ERROR_MEMORY


class NVMLError_NoData(NVMLError):
    code = NVML_ERROR_NO_DATA


class NVMLError_VgpuEccNotSupported(NVMLError):
    code = NVML_ERROR_VGPU_ECC_NOT_SUPPORTED


class NVMLError_InsufficientResources(NVMLError):
    code = NVML_ERROR_INSUFFICIENT_RESOURCES


class NVMLError_FreqNotSupported(NVMLError):
    code = NVML_ERROR_FREQ_NOT_SUPPORTED


class NVMLError_ArgumentVersionMismatch(NVMLError):
    code = NVML_ERROR_ARGUMENT_VERSION_MISMATCH


class NVMLError_Deprecated(NVMLError):
    code = NVML_ERROR_DEPRECATED


class NVMLError_NotReady(NVMLError):
    code = NVML_ERROR_NOT_READY


class NVMLError_GpuNotFound(NVMLError):
    code = NVML_ERROR_GPU_NOT_FOUND


class NVMLError_InvalidState(NVMLError):
    code = NVML_ERROR_INVALID_STATE


class NVMLError_ResetTypeNotSupported(NVMLError):
    code = NVML_ERROR_RESET_TYPE_NOT_SUPPORTED


class NVMLError_Unknown(NVMLError):
    code = NVML_ERROR_UNKNOWN


_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


def error_code(name: str) -> int | None:
    """The return code for an error name as events files write it: `unknown`, `gpuIsLost`,
    `GPU_IS_LOST` and `NVMLError_GpuIsLost` all name code 15. None when no code has the name."""
    wanted = name.removeprefix("NVMLError_").replace("_", "").lower()
    for code, cls in NVMLError.by_code.items():
        if cls.__name__.removeprefix("NVMLError_").lower() == wanted:
            return code
    return None


@record(frozen=True)
class PciInfo:
    """nvmlPciInfo_t."""

    busId: bytes
    domain: int
    bus: int
    device: int

    @property
    def busIdLegacy(self) -> bytes:
        return self.busId[4:]


@record(frozen=True)
class Memory:
    """c_nvmlMemory_t, in bytes."""

    total: int
    free: int
    used: int


class MemoryLimits:
    """c_nvmlSetMemoryLimits_v1_t and c_nvmlGetMemoryLimits_v1_t: filled in by the caller."""

    def __init__(self) -> None:
        self.nameSpace = b""
        self.softLimit = self.hardLimit = self.currentUsed = 0


@record(frozen=True)
class DeviceAttributes:
    """c_nvmlDeviceAttributes of a MIG device."""

    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int


@record(frozen=True)
class GpuInstanceProfileInfo:
    """c_nvmlGpuInstanceProfileInfo_v2_t: `id` is the driver's profile id, not the enum."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    decoderCount: int
    jpegCount: int
    ofaCount: int
    memorySizeMB: int
    copyEngineCount: int = 0
    encoderCount: int = 0


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    """nvmlGpuInstancePlacement_t, a ctypes struct as in pynvml: NVML fills a buffer of them."""

    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@record(frozen=True)
class GpuInstanceInfo:
    """c_nvmlGpuInstanceInfo_t."""

    device: Any
    id: int
    profileId: int


@record(frozen=True)
class ComputeInstanceProfileInfo:
    """c_nvmlComputeInstanceProfileInfo_v2_t."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int


@record(frozen=True)
class ComputeInstanceInfo:
    """c_nvmlComputeInstanceInfo_t."""

    device: Any
    gpuInstance: Any
    id: int
    profileId: int


@record(frozen=True)
class EventData:
    """c_nvmlEventData_t: instance ids are 0xFFFFFFFF unless the event belongs to a MIG device."""

    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@record(frozen=True)
class Value:
    """c_nvmlValue_t (the integer members the simulator fills)."""

    uiVal: int = 0
    ullVal: int = 0


@record(frozen=True)
class FieldValue:
    """c_nvmlFieldValue_t."""

    fieldId: int
    nvmlReturn: int
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_INT
    value: Value = field(default_factory=Value)
    scopeId: int = 0


@record(frozen=True)
class DeviceHandle:
    """nvmlDevice_t: a GPU (mig_uuid None) or one of its MIG devices."""

    gpu_uuid: str
    mig_uuid: str | None = None


@record(frozen=True)
class GpuInstanceHandle:
    """nvmlGpuInstance_t."""

    gpu_uuid: str
    gpu_instance_id: int


@record(frozen=True)
class ComputeInstanceHandle:
    """nvmlComputeInstance_t."""

    gpu_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
