"""The only module that imports `pynvml`: the NVML calls the plugin uses, with NVML errors
translated into `deviceplugin.errors`, and the event-set wait used by the health monitor.

INTERFACE DRAFT: the names and signatures below are the contract discovery.py and health.py
build on; bodies are still to be written. The same class runs on the real `pynvml` module or on
the simulator (`deviceplugin.sim`), which implements the same functions and NVMLError classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_SINGLE_BIT_ECC = 0x1


@dataclass(frozen=True)
class NvmlEvent:
    """One NVML event, decoded. Instance IDs are None when NVML reports 0xFFFFFFFF."""

    gpu_uuid: str
    event_type: int
    xid: int  # eventData: the Xid number (999 when NVML does not know it)
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class Probe:
    """What NVML says about a GPU when the health monitor checks whether it has recovered."""

    answers: bool  # basic queries succeed
    lost: bool  # NVML_ERROR_GPU_IS_LOST
    retired_pages_pending: bool = False
    remapped_rows_pending: bool = False
    recovery_action: int | None = None  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; None: not exposed


class EventSet:
    """NVML events registered on every GPU; `wait` blocks at most `timeout_ms`."""

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        """The next event, or None on timeout. Raises GpuLostError / NvmlError on failure."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Nvml:
    """NVML bound to a pynvml-compatible module (the real one or the simulator)."""

    def __init__(self, module: ModuleType) -> None:
        self._nvml = module

    def init(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    def event_set(self, gpu_uuids: list[str]) -> tuple[EventSet, dict[str, str]]:
        """Register Xid and ECC events on each GPU; also return {uuid: why} for GPUs that could
        not be registered (NOT_SUPPORTED is not an error: such a GPU is left unmonitored)."""
        raise NotImplementedError

    def probe(self, gpu_uuid: str) -> Probe:
        raise NotImplementedError
