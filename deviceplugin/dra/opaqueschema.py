"""The pydantic models of this driver's opaque parameters (`opaque.py` reads the entries around
them; `opaquetypes.py` holds what both use). Loaded when a claim first carries parameters of
ours, not at start-up: pydantic and these models cost `dra serve` about 40 ms before its first
slice otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from deviceplugin.dra.opaquetypes import TIME_SLICING, Interval, OpaqueConfigError


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _TimeSlicingConfig(_Model):
    interval: Interval = "Default"


class _Sharing(_Model):
    strategy: str

    @field_validator("strategy")
    @classmethod
    def _time_slicing(cls, value: str) -> str:
        if value == "MPS":
            raise ValueError("MPS is not supported by this driver; the one strategy is TimeSlicing")
        if value != TIME_SLICING:
            raise ValueError(f"must be 'TimeSlicing', got {value!r}")
        return value


class _GpuSharing(_Sharing):
    time_slicing_config: _TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")


class _GpuConfig(_Model):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: _GpuSharing | None = None


class _MigDeviceConfig(_Model):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    sharing: _Sharing | None = None


_TYPES = {"string_type": "a string", "model_type": "a mapping", "dict_type": "a mapping"}
_KINDS: dict[str, type[_GpuConfig] | type[_MigDeviceConfig]] = {
    "GpuConfig": _GpuConfig,
    "MigDeviceConfig": _MigDeviceConfig,
}


def sharing_of(kind: str, parameters: Mapping[str, Any], path: str) -> tuple[bool, str]:
    """Whether parameters of `kind` (GpuConfig or MigDeviceConfig) share the device, and a GPU's
    time-slice interval ("" for a MIG device). Raises OpaqueConfigError naming the field."""
    model = _KINDS[kind]
    try:
        parsed = model.model_validate(parameters, strict=True)
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "literal_error":
            expected = (first.get("ctx") or {}).get("expected")
            message = f"must be {expected}, got {first.get('input')!r}"
        elif first["type"] == "extra_forbidden":
            message = "is not a field of this API"
        elif first["type"] in _TYPES:
            message = f"must be {_TYPES[first['type']]}, got {first.get('input')!r}"
        raise OpaqueConfigError(f"{path}{where}", message) from None
    if parsed.sharing is None:
        return False, ""
    interval = ""
    if isinstance(parsed, _GpuConfig):
        slicing = parsed.sharing.time_slicing_config
        interval = slicing.interval if slicing is not None else "Default"
    return True, interval
