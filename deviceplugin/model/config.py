"""The v1 config file (the reference plugin's schema) as pydantic models, validated with field
paths, merged with flags and environment (flag > env > file > default).

A document is read as JSON or YAML, its keys are checked against every key the reference defines
(`config_keys`), and what remains is validated strictly: `"2"` is not a number and `"true"` is not
a boolean, as when the reference decodes the file as JSON. Every error is a `ConfigError` whose
`path` names the first offending field (`sharing.timeSlicing.resources[0].replicas`) or, for a bad
override, the flag or environment variable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from deviceplugin.model.config_keys import ENV_OVERRIDES as ENV_OVERRIDES
from deviceplugin.model.config_keys import (
    UNUSED,
    Given,
    describe,
    given_overrides,
    join,
    put,
    quote,
    read_document,
    read_file,
    scan_keys,
)
from deviceplugin.model.errors import ConfigError

MigStrategy = Literal["none", "single", "mixed"]
DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
DeviceIdStrategy = Literal["uuid", "index"]
SharedDevicesAllocationPolicy = Literal["distributed", "packed"]

MAX_REPLICAS = 1024  # beyond this a node's device list outgrows a ListAndWatch message
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UINT = re.compile(r"[0-9]{1,20}")  # Go's strconv.ParseUint: ASCII digits, no sign, < 2**64
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# The forms Go's uuid.Parse reads: canonical, 32 hex digits, urn:uuid: and braced
_UUID = re.compile(rf"{_HEX_UUID}|[0-9a-fA-F]{{32}}|(?i:urn:uuid:){_HEX_UUID}|\{{{_HEX_UUID}\}}")
_DEVICE_REF_FORMS = (
    "a GPU index (0), a MIG index (0:1), GPU-<uuid>, MIG-<uuid> or MIG-GPU-<uuid>/<gi>/<ci>"
)
DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")


def qualify_resource_name(name: str) -> str:
    """`gpu` -> `nvidia.com/gpu`; check the result is an extended resource name the kubelet takes.
    Raises ValueError saying what is wrong."""
    full = name if "/" in name else f"nvidia.com/{name}"
    domain, _, short = full.partition("/")
    if len(full) > 63:
        raise ValueError(f"{quote(full)} is longer than 63 characters")
    if "kubernetes.io/" in full:
        raise ValueError(f"'{full}': the kubernetes.io domain is reserved for Kubernetes")
    if not _DNS_SUBDOMAIN.fullmatch(domain) or "/" in short:
        raise ValueError(f"'{full}' must be 'domain/name' with a lower-case DNS domain")
    if not _DNS_SUBDOMAIN.fullmatch(short):
        raise ValueError(
            f"the name in '{full}' must be lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit"
        )
    return full


def _is_uint(value: object) -> bool:
    """A list item the reference reads as a GPU index: a JSON number that fits a uint."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


def _error_at(subpath: str, message: str) -> PydanticCustomError:
    """An error located `subpath` below the field or model whose validator raises it."""
    return PydanticCustomError("config", message, {"subpath": subpath})


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="forbid")


class PluginFlags(_Model):
    """`flags.plugin`: how allocated devices are handed to containers."""

    pass_device_specs: bool = Field(default=False, alias="passDeviceSpecs")
    device_list_strategy: tuple[DeviceListStrategy, ...] = Field(
        default=("envvar",), alias="deviceListStrategy"
    )
    device_id_strategy: DeviceIdStrategy = Field(default="uuid", alias="deviceIDStrategy")
    cdi_annotation_prefix: str = Field(default="cdi.k8s.io/", alias="cdiAnnotationPrefix")
    shared_devices_allocation_policy: SharedDevicesAllocationPolicy = Field(
        default="distributed", alias="sharedDevicesAllocationPolicy"
    )

    @field_validator("device_list_strategy", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError("must name at least one strategy")
            return tuple(value)
        return value

    @field_validator("device_list_strategy")
    @classmethod
    def _once_each(cls, value: tuple[DeviceListStrategy, ...]) -> tuple[DeviceListStrategy, ...]:
        if "cdi-annotations" in value and "cdi-cri" in value:
            raise ValueError("cdi-annotations and cdi-cri pass the same CDI devices; choose one")
        return tuple(dict.fromkeys(value))

    @field_validator("cdi_annotation_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.endswith("/") or not _DNS_SUBDOMAIN.fullmatch(value[:-1]):
            raise ValueError(
                f"must be a DNS domain followed by '/', e.g. cdi.k8s.io/, got {quote(value)}"
            )
        return value


class Flags(_Model):
    """`flags`: MIG strategy, start-up behaviour and host paths."""

    mig_strategy: MigStrategy = Field(default="none", alias="migStrategy")
    fail_on_init_error: bool = Field(default=True, alias="failOnInitError")
    nvidia_driver_root: str = Field(default="/", alias="nvidiaDriverRoot")
    # None: the same as nvidia_driver_root (see dev_root)
    nvidia_dev_root: str | None = Field(default=None, alias="nvidiaDevRoot")
    plugin: PluginFlags = PluginFlags()

    @field_validator("nvidia_driver_root", "nvidia_dev_root")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute path, got {quote(value)}")
        if value is not None and "\0" in value:
            raise ValueError("must not contain a NUL character")
        return value

    @property
    def dev_root(self) -> str:
        return self.nvidia_dev_root or self.nvidia_driver_root


class ResourcePattern(_Model):
    """One `resources.gpus` / `resources.mig` rule: devices matching the glob get `name`."""

    pattern: str
    name: str

    @field_validator("pattern")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty ('*' matches every device)")
        return value

    @field_validator("name")
    @classmethod
    def _qualified(cls, value: str) -> str:
        return qualify_resource_name(value)


def is_device_ref(text: str) -> bool:
    """Whether `text` names a device as the reference's `devices` list accepts it: a GPU index,
    a MIG index `i:j`, `GPU-<uuid>`, `MIG-<uuid>`, or the legacy `MIG-GPU-<uuid>/<gi>/<ci>`."""
    if _uint(text):
        return True
    major, colon, minor = text.partition(":")
    if colon and _uint(major) and _uint(minor):
        return True
    if text.startswith("GPU-"):
        return _UUID.fullmatch(text[4:]) is not None
    if not text.startswith("MIG-"):
        return False
    suffix = text[4:]
    if _UUID.fullmatch(suffix):
        return True
    parts = suffix.split("/", 2)
    return (
        len(parts) == 3
        and parts[0].startswith("GPU-")
        and _UUID.fullmatch(parts[0][4:]) is not None
        and _uint(parts[1])
        and _uint(parts[2])
    )


def _uint(text: str) -> bool:
    return _UINT.fullmatch(text) is not None and int(text) < 2**64


class ReplicatedResource(_Model):
    """One shared resource: which devices of `name` are advertised `replicas` times, under what."""

    name: str  # fully qualified, e.g. nvidia.com/gpu (a short "gpu" is qualified on load)
    rename: str | None = None
    # "all"; a count N (the first N devices, by index); or GPU/MIG indices and UUIDs as strings
    devices: Literal["all"] | int | tuple[str, ...] = "all"
    replicas: int

    @field_validator("name", "rename")
    @classmethod
    def _qualified(cls, value: str | None) -> str | None:
        return None if value is None else qualify_resource_name(value)

    @field_validator("devices", mode="before")
    @classmethod
    def _device_refs(cls, value: object) -> object:
        if value == "all":
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if value <= 0:
                raise ValueError(f"a count of devices must be > 0, got {describe(value)}")
            return value
        if not isinstance(value, list | tuple):
            raise ValueError(
                "must be 'all', a count of devices, or a list of GPU indices or UUIDs, "
                f"got {describe(value)}"
            )
        if not value:
            raise ValueError("must list at least one device, or be 'all'")
        refs: list[str] = []
        for position, item in enumerate(value):
            text = str(item) if _is_uint(item) else item
            if not isinstance(text, str) or not is_device_ref(text):
                raise _error_at(
                    f"[{position}]", f"must be {_DEVICE_REF_FORMS}, got {describe(item)}"
                )
            refs.append(text)
        return tuple(dict.fromkeys(refs))

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: int) -> int:
        if not 2 <= value <= MAX_REPLICAS:
            bound = ">= 2" if value < 2 else f"<= {MAX_REPLICAS}"
            raise ValueError(f"must be {bound}, got {describe(value)}")
        return value


class TimeSlicing(_Model):
    """`sharing.timeSlicing`: resources whose devices are advertised several times each."""

    rename_by_default: bool = Field(default=False, alias="renameByDefault")
    fail_requests_greater_than_one: bool = Field(default=False, alias="failRequestsGreaterThanOne")
    resources: tuple[ReplicatedResource, ...] = Field(default=(), validate_default=True)

    @field_validator("resources")
    @classmethod
    def _each_once(cls, value: tuple[ReplicatedResource, ...]) -> tuple[ReplicatedResource, ...]:
        if not value:
            raise ValueError("no resources specified: list at least one resource to share")
        first: dict[str, int] = {}
        for position, entry in enumerate(value):
            if entry.name in first:
                raise _error_at(
                    f"[{position}].name",
                    f"{entry.name} is already shared by resources[{first[entry.name]}]",
                )
            first[entry.name] = position
        return value

    @model_validator(mode="after")
    def _distinct_targets(self) -> TimeSlicing:
        first: dict[str, int] = {}
        for position, entry in enumerate(self.resources):
            target = self.advertised_name(entry)
            if target in first:
                field = "rename" if entry.rename else "name"
                raise _error_at(
                    f".resources[{position}].{field}",
                    f"{target} is already the advertised name of resources[{first[target]}]",
                )
            first[target] = position
        return self

    def advertised_name(self, entry: ReplicatedResource) -> str:
        """The name the replicas of `entry` are advertised under."""
        if entry.rename:
            return entry.rename
        return f"{entry.name}.shared" if self.rename_by_default else entry.name


class Sharing(_Model):
    """`sharing`: only time-slicing is acted on (`sharing.mps` is read, warned about, ignored)."""

    time_slicing: TimeSlicing | None = Field(default=None, alias="timeSlicing")


class Resources(_Model):
    """`resources`: renames for whole GPUs (matched on product name) and MIG profiles."""

    gpus: tuple[ResourcePattern, ...] = ()
    mig: tuple[ResourcePattern, ...] = ()


class Imex(_Model):
    """`imex`: read so that what the reference refuses at start-up is refused here too; IMEX
    channels are not injected."""

    channel_ids: tuple[int, ...] = Field(default=(), alias="channelIDs")
    required: bool = False

    @field_validator("channel_ids")
    @classmethod
    def _zero_or_none(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if value not in ((), (0,)):
            shown = ", ".join(describe(item) for item in value[:5])
            more = ", ..." if len(value) > 5 else ""
            raise ValueError(f"must be [] or [0] (channel 0 is the only one), got [{shown}{more}]")
        return value


class Config(_Model):
    """A whole v1 config; the defaults are those of an empty file."""

    version: Literal["v1"] = "v1"
    flags: Flags = Flags()
    resources: Resources = Resources()
    sharing: Sharing = Sharing()

    @field_validator("version", mode="before")
    @classmethod
    def _v1(cls, value: object) -> object:
        if value == "":
            return "v1"
        if isinstance(value, str) and value != "v1":
            raise ValueError(f"unknown version {quote(value)}: only v1 is supported")
        return value


@dataclass(frozen=True)
class ParsedConfig:
    """A valid config and the warnings about what in it is accepted but not acted on."""

    config: Config
    warnings: tuple[str, ...] = ()


def parse_config(text: str, source: str = "<config>") -> ParsedConfig:
    """Validate a v1 config given as YAML or JSON text; a document with no content is an error
    (`version: v1` gives the defaults)."""
    return _build(read_document(text, source), ())


def load_config(
    path: str | None, cli: Mapping[str, str | None], env: Mapping[str, str]
) -> ParsedConfig:
    """Read the file at `path` (none: defaults), then apply overrides, flag > env > file.

    `cli` maps the keys of ENV_OVERRIDES to a flag's value, None when the flag was not given
    (other keys are ignored); an empty environment variable counts as unset."""
    document = {} if path is None else read_file(path)
    return _with_overrides(document, cli, env)


def load_config_text(
    text: str | None, source: str | None, cli: Mapping[str, str | None], env: Mapping[str, str]
) -> ParsedConfig:
    """`load_config` on text already read (so a caller can compare it before parsing); None
    stands for no config file, the defaults."""
    document = {} if text is None else read_document(text, source or "<config>")
    return _with_overrides(document, cli, env)


def _with_overrides(
    document: dict[str, object], cli: Mapping[str, str | None], env: Mapping[str, str]
) -> ParsedConfig:
    parsed = _build(document, ())  # the file must be valid on its own, whatever overrides it
    overrides = given_overrides(cli, env)
    return _build(document, overrides) if overrides else parsed


def summary(config: Config) -> str:
    """One line for `validate-config`, e.g. `valid v1 config: migStrategy=mixed,
    deviceListStrategy=envvar, time-slicing nvidia.com/gpu x2`."""
    plugin = config.flags.plugin
    parts = [
        f"migStrategy={config.flags.mig_strategy}",
        f"deviceListStrategy={','.join(plugin.device_list_strategy)}",
    ]
    if plugin.device_id_strategy != "uuid":
        parts.append(f"deviceIDStrategy={plugin.device_id_strategy}")
    slicing = config.sharing.time_slicing
    if slicing is None:
        parts.append("no sharing")
    else:
        shared = []
        for entry in slicing.resources:
            text = entry.name
            if isinstance(entry.devices, int):
                text += f"[first {entry.devices}]"
            elif entry.devices != "all":
                text += f"[{','.join(entry.devices)}]"
            text += f" x{entry.replicas}"
            if slicing.advertised_name(entry) != entry.name:
                text += f" as {slicing.advertised_name(entry)}"
            shared.append(text)
        parts.append("time-slicing " + ", ".join(shared))
    return f"valid {config.version} config: " + ", ".join(parts)


def _build(document: Mapping[str, object], overrides: Sequence[Given]) -> ParsedConfig:
    scan = scan_keys(document)
    if scan.unknown:
        raise _combined(scan.unknown)
    for given in overrides:
        put(scan.known, given.path, given.value)
    labels = {given.path: given.label for given in overrides}
    config = _validate(Config, scan.known, "", labels)
    _check_unused(scan.unused, config)
    warnings: list[str] = []
    for path, value in scan.unused.items():
        if path == "sharing.mps":
            mps = _validate(TimeSlicing, value, path, {})
            names = ", ".join(f"{entry.name} x{entry.replicas}" for entry in mps.resources)
            warnings.append(
                f"sharing.mps: MPS sharing is not supported and is NOT applied: {names} "
                "will not be shared through MPS"
            )
        elif value != {}:
            keys = f" ({', '.join(value)})" if isinstance(value, dict) else ""
            warnings.append(f"{path}{keys}: not used by this plugin ({UNUSED[path]}); ignored")
    return ParsedConfig(config=config, warnings=tuple(warnings))


def _check_unused(unused: Mapping[str, object], config: Config) -> None:
    """Keys this plugin does not act on, refused where the reference refuses them at start-up,
    so a file is accepted or refused here as it is there."""
    if "imex" in unused:
        _validate(Imex, unused["imex"], "imex", {})
    strategy = unused.get("flags.deviceDiscoveryStrategy")
    if strategy is not None and strategy not in DISCOVERY_STRATEGIES:
        raise ConfigError(
            "flags.deviceDiscoveryStrategy",
            f"must be one of {', '.join(DISCOVERY_STRATEGIES)}, got {describe(strategy)}",
        )
    if "sharing.mps" in unused:
        _validate(TimeSlicing, unused["sharing.mps"], "sharing.mps", {})
        if config.flags.mig_strategy == "mixed":
            raise ConfigError("sharing.mps", "MPS sharing cannot be used with migStrategy mixed")
        root = unused.get("flags.mpsRoot")
        if not isinstance(root, str) or not root:
            raise ConfigError(
                "flags.mpsRoot",
                "sharing.mps needs the MPS daemon's root directory here (e.g. /run/nvidia/mps), "
                f"got {describe(root)}",
            )


_M = TypeVar("_M", bound=BaseModel)


def _validate(model: type[_M], data: object, prefix: str, labels: Mapping[str, str]) -> _M:
    # Validated as JSON in strict mode: no '2' -> 2 or 'yes' -> True coercion, lists fill tuples.
    try:
        return model.model_validate_json(json.dumps(data, default=str), strict=True)
    except ValidationError as exc:
        errors = [_locate(error, prefix, labels) for error in exc.errors()]
        raise _combined(errors) from None


def _locate(error: ErrorDetails, prefix: str, labels: Mapping[str, str]) -> tuple[str, str]:
    """A pydantic error -> (path, message); a path under an override names its flag or env var."""
    path = prefix
    for part in error["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" not in part:  # skip union member tags such as "tuple[str, ...]"
            path = join(path, part)
    path += str((error.get("ctx") or {}).get("subpath", ""))
    message = _message(error)
    for field, label in labels.items():
        if path == field or path.startswith((field + ".", field + "[")):
            return label, f"{message} (overrides {field})"
    return path, message


_TYPES = {
    "string_type": "a string",
    "int_type": "an integer",
    "bool_type": "true or false",
    "tuple_type": "a list",
    "model_type": "a mapping",
}


def _message(error: ErrorDetails) -> str:
    kind, given = error["type"], error.get("input")
    if kind == "missing":
        return "is required"
    if kind in _TYPES:
        quoted = " (a quoted string)" if isinstance(given, str) else ""
        return f"must be {_TYPES[kind]}, got {describe(given)}{quoted}"
    if kind == "literal_error":
        return f"must be {(error.get('ctx') or {}).get('expected')}, got {describe(given)}"
    if kind == "json_invalid":  # what JSON and YAML let through but is no text: "\ud800"
        return "the document holds a lone surrogate escape (such as \\ud800), which is not text"
    return error["msg"].removeprefix("Value error, ")


def _combined(errors: list[tuple[str, str]]) -> ConfigError:
    """The first error, with the others summed up in its message."""
    (path, message), rest = errors[0], errors[1:]
    if rest:
        listed = "; ".join(f"{p or '(top)'}: {m}" for p, m in rest[:4])
        more = f"; and {len(rest) - 4} more" if len(rest) > 4 else ""
        message += f" (and {len(rest)} more error{'s' if len(rest) > 1 else ''}: {listed}{more})"
    return ConfigError(path, message)
