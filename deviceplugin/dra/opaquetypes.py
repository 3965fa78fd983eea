"""What the reader of this driver's opaque config entries (`opaque`) and the models of their
parameters (`opaqueschema`) both speak: the one sharing strategy, a GPU's time-slice intervals,
and the error that names the offending field. Apart from both, so neither imports the other's
module just for these."""

from __future__ import annotations

from typing import Literal

from deviceplugin.model.errors import DevicePluginError

TIME_SLICING = "TimeSlicing"

Interval = Literal["Default", "Short", "Medium", "Long"]


class OpaqueConfigError(DevicePluginError):
    """An opaque configuration entry of this driver is invalid; `path` names the field."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")
