"""The pydantic models of this driver's opaque parameters (`opaque.py` reads the entries around
them; `opaquetypes.py` holds what both use). Loaded when a claim first carries parameters of
ours, not at start-up: pydantic and these models cost `dra serve` about 40 ms before its first
slice otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from deviceplugin.dra.opaquebounds import MAX_DEVICES
from deviceplugin.dra.opaquetypes import (
    MPS,
    STRATEGIES,
    TIME_SLICING,
    Interval,
    MpsSettings,
    OpaqueConfigError,
)
from deviceplugin.model.quantity import parse_quantity

MIB = 1 << 20


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _TimeSlicingConfig(_Model):
    interval: Interval = "Default"


def _megabytes(value: str | int | float) -> int:
    """A Kubernetes quantity (a string, or a JSON number as `resource.Quantity` reads one) in
    bytes, within Kubernetes' bound (`parse_quantity`; `opaquebounds` refused a longer integer);
    at least one MiB, as NVIDIA's driver requires (it hands limits on in whole MiB)."""
    try:
        size = parse_quantity(str(value))
    except ValueError as err:
        raise ValueError(str(err)) from None
    if size < MIB:
        raise ValueError(f"must be at least 1Mi (limits are given in whole MiB), got {value!r}")
    return size


class _MpsConfig(_Model):
    """NVIDIA's `MpsConfig` (v1beta1)."""

    default_active_thread_percentage: int | None = Field(
        default=None, alias="defaultActiveThreadPercentage"
    )
    default_pinned_device_memory_limit: str | int | float | None = Field(
        default=None, alias="defaultPinnedDeviceMemoryLimit"
    )
    default_per_device_pinned_memory_limit: dict[str, str | int | float] | None = Field(
        default=None, alias="defaultPerDevicePinnedMemoryLimit"
    )

    @field_validator("default_active_thread_percentage")
    @classmethod
    def _percentage(cls, value: int | None) -> int | None:
        # NVIDIA's validation allows 0, which its control daemon then refuses: refused here
        if value is not None and not 1 <= value <= 100:
            raise ValueError(f"must be between 1 and 100, got {value}")
        return value

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _limit(cls, value: str | int | float | None) -> str | int | float | None:
        if value is not None:
            _megabytes(value)
        return value

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _limits(
        cls, value: dict[str, str | int | float] | None
    ) -> dict[str, str | int | float] | None:
        if value is not None and len(value) > MAX_DEVICES:
            raise ValueError(
                f"has {len(value)} entries, more than the {MAX_DEVICES} devices a claim can hold"
            )
        for device, limit in (value or {}).items():
            try:
                _megabytes(limit)
            except ValueError as err:
                raise ValueError(f"{device}: {err}") from None
        return value


class _Sharing(_Model):
    strategy: str
    mps_config: _MpsConfig | None = Field(default=None, alias="mpsConfig")

    @field_validator("strategy")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in STRATEGIES:
            raise ValueError(f"must be {' or '.join(map(repr, STRATEGIES))}, got {value!r}")
        return value

    @field_validator("mps_config")
    @classmethod
    def _mps_only(cls, value: _MpsConfig | None, info: ValidationInfo) -> _MpsConfig | None:
        strategy = info.data.get("strategy")
        if value is not None and strategy not in (None, MPS):
            raise ValueError(f"cannot be used with the {strategy!r} strategy, only with 'MPS'")
        return value


class _GpuSharing(_Sharing):
    time_slicing_config: _TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")

    @field_validator("time_slicing_config")
    @classmethod
    def _time_slicing_only(
        cls, value: _TimeSlicingConfig | None, info: ValidationInfo
    ) -> _TimeSlicingConfig | None:
        if value is not None and info.data.get("strategy") == MPS:
            raise ValueError("cannot be used with the 'MPS' strategy, only with 'TimeSlicing'")
        return value


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


def sharing_of(
    kind: str, parameters: Mapping[str, Any], path: str
) -> tuple[str, str, MpsSettings | None]:
    """How parameters of `kind` (GpuConfig or MigDeviceConfig) share the device: the strategy
    ("" for not shared), a GPU's time-slice interval ("" otherwise) and, for MPS, its limits.
    Raises OpaqueConfigError naming the field."""
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
    sharing = parsed.sharing
    if sharing is None:
        return "", "", None
    if sharing.strategy == MPS:
        return MPS, "", _mps_settings(sharing.mps_config, f"{path}.sharing.mpsConfig")
    interval = ""
    if isinstance(sharing, _GpuSharing):
        slicing = sharing.time_slicing_config
        interval = slicing.interval if slicing is not None else "Default"
    return TIME_SLICING, interval, None


def _mps_settings(config: _MpsConfig | None, path: str) -> MpsSettings:
    if config is None:
        return MpsSettings(path)
    pinned = config.default_pinned_device_memory_limit
    per_device = config.default_per_device_pinned_memory_limit or {}
    return MpsSettings(
        path,
        config.default_active_thread_percentage,
        None if pinned is None else _megabytes(pinned),
        tuple((device, _megabytes(limit)) for device, limit in per_device.items()),
    )
