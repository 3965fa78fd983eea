"""The v1 config file (the reference plugin's schema) as frozen dataclasses, validated with field
paths, merged with flags and environment (flag > env > file > default).

A document is read as JSON or YAML, its keys are checked against every key the reference defines
(`config_keys`), and what remains is validated strictly: `"2"` is not a number and `"true"` is not
a boolean, as when the reference decodes the file as JSON. Every error is a `ConfigError` whose
`path` names the first offending field (`sharing.timeSlicing.resources[0].replicas`) or, for a bad
override, the flag or environment variable. The models are read by `strict`: plain functions, so
importing this module and reading a config at start-up cost about a millisecond, not the tenth
of a second and 8 MiB a schema library took to build its validators.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args

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
    scan_keys,
)
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.hostpaths import (
    MPS_CONTROL_SOCKET,
    SYSTEM_DIRS,
    mps_paths,
    socket_path_problem,
    under_system_dir,
)
from deviceplugin.model.record import record
from deviceplugin.model.strict import (
    BAD,
    Invalid,
    Problem,
    as_is,
    before,
    boolean,
    checked,
    dump,
    field,
    integer,
    literal,
    model,
    nullable,
    string,
    tuple_of,
)

MigStrategy = Literal["none", "single", "mixed"]
DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
DeviceIdStrategy = Literal["uuid", "index"]
SharedDevicesAllocationPolicy = Literal["distributed", "packed"]

MAX_REPLICAS = 1024  # beyond this a node's device list outgrows a ListAndWatch message
# Patterns, compiled (and cached by `re`) when first matched.
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_UINT = r"[0-9]{1,20}"  # Go's strconv.ParseUint: ASCII digits, no sign, < 2**64
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# The forms Go's uuid.Parse reads: canonical, 32 hex digits, urn:uuid: and braced
_UUID = rf"{_HEX_UUID}|[0-9a-fA-F]{{32}}|(?i:urn:uuid:){_HEX_UUID}|\{{{_HEX_UUID}\}}"
_LONE_SURROGATE = "[\ud800-\udfff]"
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
    if not re.fullmatch(_DNS_SUBDOMAIN, domain) or "/" in short:
        raise ValueError(f"'{full}' must be 'domain/name' with a lower-case DNS domain")
    if not re.fullmatch(_DNS_SUBDOMAIN, short):
        raise ValueError(
            f"the name in '{full}' must be lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit"
        )
    return full


def _is_uint(value: object) -> bool:
    """A list item the reference reads as a GPU index: a JSON number that fits a uint."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


_model = record(frozen=True, kw_only=True)


def _one_or_many(value: object) -> object:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError("must name at least one strategy")
        return tuple(value)
    return value


def _once_each(value: tuple[DeviceListStrategy, ...]) -> tuple[DeviceListStrategy, ...]:
    if "cdi-annotations" in value and "cdi-cri" in value:
        raise ValueError("cdi-annotations and cdi-cri pass the same CDI devices; choose one")
    return tuple(dict.fromkeys(value))


def _prefix(value: str) -> str:
    if not value.endswith("/") or not re.fullmatch(_DNS_SUBDOMAIN, value[:-1]):
        raise ValueError(
            f"must be a DNS domain followed by '/', e.g. cdi.k8s.io/, got {quote(value)}"
        )
    return value


@_model
class PluginFlags:
    """`flags.plugin`: how allocated devices are handed to containers."""

    pass_device_specs: bool = field("passDeviceSpecs", boolean, False)
    device_list_strategy: tuple[DeviceListStrategy, ...] = field(
        "deviceListStrategy",
        before(_one_or_many, checked(tuple_of(literal(*get_args(DeviceListStrategy))), _once_each)),
        ("envvar",),
    )
    device_id_strategy: DeviceIdStrategy = field(
        "deviceIDStrategy", literal(*get_args(DeviceIdStrategy)), "uuid"
    )
    cdi_annotation_prefix: str = field(
        "cdiAnnotationPrefix", checked(string, _prefix), "cdi.k8s.io/"
    )
    shared_devices_allocation_policy: SharedDevicesAllocationPolicy = field(
        "sharedDevicesAllocationPolicy",
        literal(*get_args(SharedDevicesAllocationPolicy)),
        "distributed",
    )


def _mps_root_or_unset(value: str) -> str | None:
    """`flags.mpsRoot`: the reference's unset value is the empty string. The daemons run as
    root and write there, and `<mpsRoot>/shm` becomes every MPS container's /dev/shm, so it
    must be a clean path of its own: `/dev` would hand every container the host's /dev/shm, and
    a `..` can lead anywhere."""
    if not value:
        return None
    _absolute(value)
    clean = posixpath.normpath(value)
    if clean != value or value.startswith("//"):
        raise ValueError(
            f"must be a clean absolute path (no '.' or '..' component, no doubled or trailing"
            f" '/'), got {quote(value)}"
        )
    if value == "/" or under_system_dir(value):
        raise ValueError(
            f"must be a directory for the MPS daemons, not / or under {', '.join(SYSTEM_DIRS)}"
            f" (<mpsRoot>/shm is every MPS container's /dev/shm), got {quote(value)}"
        )
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {quote(value)}")
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    return value


@_model
class Flags:
    """`flags`: MIG strategy, start-up behaviour and host paths."""

    mig_strategy: MigStrategy = field("migStrategy", literal(*get_args(MigStrategy)), "none")
    fail_on_init_error: bool = field("failOnInitError", boolean, True)
    nvidia_driver_root: str = field("nvidiaDriverRoot", checked(string, _absolute), "/")
    # None: the same as nvidia_driver_root (see dev_root)
    nvidia_dev_root: str | None = field("nvidiaDevRoot", nullable(checked(string, _absolute)), None)
    # Where the MPS control daemons keep their pipe, log and shm directories (sharing.mps).
    mps_root: str | None = field("mpsRoot", nullable(checked(string, _mps_root_or_unset)), None)
    # Ask the NVIDIA runtime to add GDRCopy, GPUDirect Storage and MOFED support to every
    # container (NVIDIA_GDRCOPY/NVIDIA_GDS/NVIDIA_MOFED=enabled): on by default, as in the
    # reference plugin v0.19.0.
    gdrcopy_enabled: bool = field("gdrcopyEnabled", boolean, True)
    gds_enabled: bool = field("gdsEnabled", boolean, True)
    mofed_enabled: bool = field("mofedEnabled", boolean, True)
    plugin: PluginFlags = field("plugin", model(PluginFlags), PluginFlags())

    @property
    def dev_root(self) -> str:
        return self.nvidia_dev_root or self.nvidia_driver_root


def _not_empty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty ('*' matches every device)")
    return value


_qualified = checked(string, qualify_resource_name)


@_model
class ResourcePattern:
    """One `resources.gpus` / `resources.mig` rule: devices matching the glob get `name`."""

    pattern: str = field(read=checked(string, _not_empty))
    name: str = field(read=_qualified)


def is_device_ref(text: str) -> bool:
    """Whether `text` names a device as the reference's `devices` list accepts it: a GPU index,
    a MIG index `i:j`, `GPU-<uuid>`, `MIG-<uuid>`, or the legacy `MIG-GPU-<uuid>/<gi>/<ci>`."""
    if _uint(text):
        return True
    major, colon, minor = text.partition(":")
    if colon and _uint(major) and _uint(minor):
        return True
    if text.startswith("GPU-"):
        return _is_uuid(text[4:])
    if not text.startswith("MIG-"):
        return False
    suffix = text[4:]
    if _is_uuid(suffix):
        return True
    parts = suffix.split("/", 2)
    return (
        len(parts) == 3
        and parts[0].startswith("GPU-")
        and _is_uuid(parts[0][4:])
        and _uint(parts[1])
        and _uint(parts[2])
    )


def _uint(text: str) -> bool:
    return re.fullmatch(_UINT, text) is not None and int(text) < 2**64


def _is_uuid(text: str) -> bool:
    return re.fullmatch(_UUID, text) is not None


def _device_refs(value: object) -> object:
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
            raise Invalid(f"must be {_DEVICE_REF_FORMS}, got {describe(item)}", f"[{position}]")
        refs.append(text)
    return tuple(dict.fromkeys(refs))


def _replicas(value: int) -> int:
    if not 2 <= value <= MAX_REPLICAS:
        bound = ">= 2" if value < 2 else f"<= {MAX_REPLICAS}"
        raise ValueError(f"must be {bound}, got {describe(value)}")
    return value


@_model
class ReplicatedResource:
    """One shared resource: which devices of `name` are advertised `replicas` times, under what."""

    name: str = field(read=_qualified)  # fully qualified: a short "gpu" is qualified on load
    rename: str | None = field(read=nullable(_qualified), default=None)
    # "all"; a count N (the first N devices, by index); or GPU/MIG indices and UUIDs as strings
    devices: Literal["all"] | int | tuple[str, ...] = field(
        read=before(_device_refs, as_is), default="all"
    )
    replicas: int = field(read=checked(integer, _replicas))


def _each_once(value: tuple[ReplicatedResource, ...]) -> tuple[ReplicatedResource, ...]:
    if not value:
        raise ValueError("no resources specified: list at least one resource to share")
    first: dict[str, int] = {}
    for position, entry in enumerate(value):
        if entry.name in first:
            raise Invalid(
                f"{entry.name} is already shared by resources[{first[entry.name]}]",
                f"[{position}].name",
            )
        first[entry.name] = position
    return value


@_model
class TimeSlicing:
    """`sharing.timeSlicing`: resources whose devices are advertised several times each."""

    rename_by_default: bool = field("renameByDefault", boolean, False)
    fail_requests_greater_than_one: bool = field("failRequestsGreaterThanOne", boolean, False)
    resources: tuple[ReplicatedResource, ...] = field(
        read=checked(tuple_of(model(ReplicatedResource)), _each_once),
        default=(),
        check_default=True,
    )

    def model_check(self) -> TimeSlicing:
        """No two resources advertised under one name."""
        first: dict[str, int] = {}
        for position, entry in enumerate(self.resources):
            target = self.advertised_name(entry)
            if target in first:
                field = "rename" if entry.rename else "name"
                raise Invalid(
                    f"{target} is already the advertised name of resources[{first[target]}]",
                    f".resources[{position}].{field}",
                )
            first[target] = position
        return self

    def advertised_name(self, entry: ReplicatedResource) -> str:
        """The name the replicas of `entry` are advertised under."""
        if entry.rename:
            return entry.rename
        return f"{entry.name}.shared" if self.rename_by_default else entry.name


@_model
class Mps(TimeSlicing):
    """`sharing.mps`: resources shared through one MPS control daemon each, with the replica IDs
    of time-slicing; as in the reference, a request for more than one replica is refused unless
    `failRequestsGreaterThanOne: false` says otherwise."""

    fail_requests_greater_than_one: bool = field("failRequestsGreaterThanOne", boolean, True)


@_model
class Sharing:
    """`sharing`: time-slicing or MPS; with both, MPS is acted on, as in the reference."""

    time_slicing: TimeSlicing | None = field("timeSlicing", nullable(model(TimeSlicing)), None)
    mps: Mps | None = field("mps", nullable(model(Mps)), None)

    @property
    def replicated(self) -> tuple[TimeSlicing | None, str]:
        """The section acted on and its config path."""
        if self.mps is not None:
            return self.mps, "sharing.mps"
        return self.time_slicing, "sharing.timeSlicing"


@_model
class Resources:
    """`resources`: renames for whole GPUs (matched on product name) and MIG profiles."""

    gpus: tuple[ResourcePattern, ...] = field(read=tuple_of(model(ResourcePattern)), default=())
    mig: tuple[ResourcePattern, ...] = field(read=tuple_of(model(ResourcePattern)), default=())


def _zero_or_none(value: tuple[int, ...]) -> tuple[int, ...]:
    if value not in ((), (0,)):
        shown = ", ".join(describe(item) for item in value[:5])
        more = ", ..." if len(value) > 5 else ""
        raise ValueError(f"must be [] or [0] (channel 0 is the only one), got [{shown}{more}]")
    return value


@_model
class Imex:
    """`imex`: read so that what the reference refuses at start-up is refused here too; IMEX
    channels are not injected."""

    channel_ids: tuple[int, ...] = field(
        "channelIDs", checked(tuple_of(integer), _zero_or_none), ()
    )
    required: bool = field(read=boolean, default=False)


def _v1(value: object) -> object:
    if value == "":
        return "v1"
    if isinstance(value, str) and value != "v1":
        raise ValueError(f"unknown version {quote(value)}: only v1 is supported")
    return value


@_model
class Config:
    """A whole v1 config; the defaults are those of an empty file."""

    version: Literal["v1"] = field(read=before(_v1, literal("v1")), default="v1")
    flags: Flags = field(read=model(Flags), default=Flags())
    resources: Resources = field(read=model(Resources), default=Resources())
    sharing: Sharing = field(read=model(Sharing), default=Sharing())

    def dump(self) -> dict[str, Any]:
        """The config as a document with the file's keys: logged and shown on /status."""
        document: dict[str, Any] = dump(self)
        return document


@record(frozen=True)
class ParsedConfig:
    """A valid config and the warnings about what in it is accepted but not acted on."""

    config: Config
    warnings: tuple[str, ...] = ()


def parse_config(text: str, source: str = "<config>") -> ParsedConfig:
    """Validate a v1 config given as YAML or JSON text; a document with no content is an error
    (`version: v1` gives the defaults)."""
    return _build(read_document(text, source), ())


def load_config_text(
    text: str | None, source: str | None, cli: Mapping[str, str | None], env: Mapping[str, str]
) -> ParsedConfig:
    """The config file's `text` (None: no config file, the defaults), then the overrides,
    flag > env > file. `cli` maps the keys of ENV_OVERRIDES to a flag's value, None when the
    flag was not given (other keys are ignored); an empty environment variable counts as
    unset."""
    document = {} if text is None else read_document(text, source or "<config>")
    return _with_overrides(document, cli, env)


def _with_overrides(
    document: dict[str, object], cli: Mapping[str, str | None], env: Mapping[str, str]
) -> ParsedConfig:
    overrides = given_overrides(cli, env)
    # The file must be valid on its own, whatever overrides it, except for what an override may
    # complete: a file without flags.mpsRoot takes MPS_ROOT, as the reference's chart sets it.
    parsed = _build(document, (), complete=not overrides)
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
    slicing, path = config.sharing.replicated
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
        mode = "mps" if path == "sharing.mps" else "time-slicing"
        parts.append(f"{mode} " + ", ".join(shared))
    return f"valid {config.version} config: " + ", ".join(parts)


def _build(
    document: Mapping[str, object], overrides: Sequence[Given], complete: bool = True
) -> ParsedConfig:
    """The config of `document` with `overrides`; with `complete`, also what the whole config
    must hold (`_check_complete`)."""
    scan = scan_keys(document)
    if scan.unknown:
        raise _combined(scan.unknown)
    for given in overrides:
        put(scan.known, given.path, given.value)
    labels = {given.path: given.label for given in overrides}
    config = _validate(Config, scan.known, "", labels)
    _check_unused(scan.unused, config)
    _check_mps_sockets(config)
    if complete:
        _check_complete(config)
    warnings: list[str] = []
    if config.sharing.mps is not None and config.sharing.time_slicing is not None:
        warnings.append(
            "sharing.timeSlicing: ignored, sharing.mps is given too and MPS is acted on "
            "(as the reference does)"
        )
    for path, value in scan.unused.items():
        if value != {}:
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
    if config.sharing.mps is not None and config.flags.mig_strategy == "mixed":
        raise ConfigError("sharing.mps", "MPS sharing cannot be used with migStrategy mixed")


def _check_mps_sockets(config: Config) -> None:
    """Each MPS daemon's control socket, `<mpsRoot>/<resource>/pipe/control`, fits a unix socket
    path: a daemon whose socket does not could never start."""
    mps, root = config.sharing.mps, config.flags.mps_root
    if mps is None or root is None:
        return
    for position, entry in enumerate(mps.resources):
        name = mps.advertised_name(entry)
        socket = posixpath.join(mps_paths(root, name)[0], MPS_CONTROL_SOCKET)
        if (problem := socket_path_problem(socket)) is not None:
            raise ConfigError(
                "flags.mpsRoot",
                f"too long for the MPS control socket of sharing.mps.resources[{position}]"
                f" ({name}): {problem}",
            )


def _check_complete(config: Config) -> None:
    """What only the file and its overrides together must hold."""
    if config.sharing.mps is not None and config.flags.mps_root is None:
        raise ConfigError(
            "flags.mpsRoot",
            "sharing.mps needs the MPS daemon's root directory here (e.g. /run/nvidia/mps) "
            "or in MPS_ROOT, got none",
        )


_M = TypeVar("_M")


def _validate(cls: type[_M], data: object, prefix: str, labels: Mapping[str, str]) -> _M:
    # Read as the JSON it would be (a YAML date is text), strictly: no '2' -> 2 or 'yes' -> True.
    document = json.loads(json.dumps(data, default=str))
    if _holds_lone_surrogate(document):  # what JSON and YAML let through but is no text
        raise ConfigError(
            prefix,
            "the document holds a lone surrogate escape (such as \\ud800), which is not text",
        )
    problems: list[Problem] = []
    read = model(cls)(document, (), problems)
    if read is BAD:
        raise _combined([_locate(problem, prefix, labels) for problem in problems])
    made: _M = read
    return made


def _holds_lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return re.search(_LONE_SURROGATE, value) is not None
    if isinstance(value, dict):
        return any(_holds_lone_surrogate(k) or _holds_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_lone_surrogate(item) for item in value)
    return False


def _locate(problem: Problem, prefix: str, labels: Mapping[str, str]) -> tuple[str, str]:
    """A problem -> (path, message); a path under an override names its flag or env var."""
    path = prefix
    for part in problem.loc:
        path = f"{path}[{part}]" if isinstance(part, int) else join(path, part)
    path += problem.subpath
    for field_path, label in labels.items():
        if path == field_path or path.startswith((field_path + ".", field_path + "[")):
            return label, f"{problem.message} (overrides {field_path})"
    return path, problem.message


def _combined(errors: list[tuple[str, str]]) -> ConfigError:
    """The first error, with the others summed up in its message."""
    (path, message), rest = errors[0], errors[1:]
    if rest:
        listed = "; ".join(f"{p or '(top)'}: {m}" for p, m in rest[:4])
        more = f"; and {len(rest) - 4} more" if len(rest) > 4 else ""
        message += f" (and {len(rest)} more error{'s' if len(rest) > 1 else ''}: {listed}{more})"
    return ConfigError(path, message)
