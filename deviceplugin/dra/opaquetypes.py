"""What the reader of this driver's opaque config entries (`opaque`) and the models of their
parameters (`opaqueschema`) both speak: the sharing strategies, a GPU's time-slice intervals,
a claim's MPS limits, and the error that names the offending field. Apart from both, so neither
imports the other's module just for these."""

from __future__ import annotations

from typing import Literal

from deviceplugin.model.errors import DevicePluginError
from deviceplugin.model.record import record

TIME_SLICING = "TimeSlicing"
MPS = "MPS"
STRATEGIES = (TIME_SLICING, MPS)

Interval = Literal["Default", "Short", "Medium", "Long"]


class OpaqueConfigError(DevicePluginError):
    """An opaque configuration entry of this driver is invalid; `path` names the field."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


@record(frozen=True)
class MpsSettings:
    """A claim's MPS client limits as its `mpsConfig` gives them (None or empty: not set);
    `path` is the mpsConfig field, so a limit Prepare refuses is named."""

    path: str
    thread_percentage: int | None = None  # defaultActiveThreadPercentage
    pinned_limit: int | None = None  # defaultPinnedDeviceMemoryLimit, bytes
    per_device: tuple[tuple[str, int], ...] = ()  # defaultPerDevicePinnedMemoryLimit, bytes
