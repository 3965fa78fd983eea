"""The raw config document, before the typed models see it: text in, keys checked, overrides in.

`read_document` parses JSON or YAML, rejecting duplicate keys and keeping YAML 1.1 from reading
the MIG index `1:0` as the base-60 number 60. `scan_keys` checks every key against the key tree of
the reference plugin's v1 schema: a key no version defines is an error naming its path (with a
did-you-mean); a key it defines that this plugin does not act on is set aside for a warning.
`given_overrides` turns flags and environment variables into values at document paths.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

import yaml

from deviceplugin.model.errors import ConfigError

# A mapping shape lists its keys; a one-element list describes every item of a list; None is a
# scalar (or any value whose type the models check).
Shape: TypeAlias = "Mapping[str, Shape] | list[Shape] | None"

_REPLICATED: Shape = {
    "renameByDefault": None,
    "failRequestsGreaterThanOne": None,
    "resources": [{"name": None, "rename": None, "devices": None, "replicas": None}],
}
_PATTERNS: Shape = [{"pattern": None, "name": None}]

SCHEMA: Mapping[str, Shape] = {
    "version": None,
    "flags": {
        "migStrategy": None,
        "failOnInitError": None,
        "nvidiaDriverRoot": None,
        "nvidiaDevRoot": None,
        "mpsRoot": None,
        "gdrcopyEnabled": None,
        "gdsEnabled": None,
        "mofedEnabled": None,
        "useNodeFeatureAPI": None,
        "deviceDiscoveryStrategy": None,
        "plugin": {
            "passDeviceSpecs": None,
            "deviceListStrategy": None,
            "deviceIDStrategy": None,
            "cdiAnnotationPrefix": None,
            "nvidiaCTKPath": None,
            "containerDriverRoot": None,
            "sharedDevicesAllocationPolicy": None,
        },
        "gfd": {
            "oneshot": None,
            "noTimestamp": None,
            "sleepInterval": None,
            "outputFile": None,
            "machineTypeFile": None,
        },
    },
    "resources": {"gpus": _PATTERNS, "mig": _PATTERNS},
    "sharing": {"timeSlicing": _REPLICATED, "mps": _REPLICATED},
    "imex": {"channelIDs": None, "required": None},
}

# Keys the reference defines but this plugin does not act on: path -> why.
UNUSED: Mapping[str, str] = {
    "flags.mpsRoot": "MPS is not supported",
    "flags.gdrcopyEnabled": "GDRCopy is not injected",
    "flags.gdsEnabled": "GPUDirect Storage is not injected",
    "flags.mofedEnabled": "MOFED is not injected",
    "flags.useNodeFeatureAPI": "it configures gpu-feature-discovery",
    "flags.deviceDiscoveryStrategy": "devices are always discovered through NVML",
    "flags.gfd": "it configures gpu-feature-discovery",
    "flags.plugin.nvidiaCTKPath": "only the reference's own CDI spec generation uses it",
    "flags.plugin.containerDriverRoot": "only the reference's own CDI spec generation uses it",
    "sharing.mps": "MPS is not supported",
    "imex": "IMEX channels are not supported",
}


@dataclass(frozen=True)
class _Override:
    env: str
    path: tuple[str, ...]
    kind: Literal["str", "bool", "list"] = "str"


_OVERRIDES: Mapping[str, _Override] = {
    "mig_strategy": _Override("MIG_STRATEGY", ("flags", "migStrategy")),
    "fail_on_init_error": _Override("FAIL_ON_INIT_ERROR", ("flags", "failOnInitError"), "bool"),
    "pass_device_specs": _Override(
        "PASS_DEVICE_SPECS", ("flags", "plugin", "passDeviceSpecs"), "bool"
    ),
    "device_list_strategy": _Override(
        "DEVICE_LIST_STRATEGY", ("flags", "plugin", "deviceListStrategy"), "list"
    ),
    "device_id_strategy": _Override("DEVICE_ID_STRATEGY", ("flags", "plugin", "deviceIDStrategy")),
    "nvidia_driver_root": _Override("NVIDIA_DRIVER_ROOT", ("flags", "nvidiaDriverRoot")),
    "nvidia_dev_root": _Override("NVIDIA_DEV_ROOT", ("flags", "nvidiaDevRoot")),
    "cdi_annotation_prefix": _Override(
        "CDI_ANNOTATION_PREFIX", ("flags", "plugin", "cdiAnnotationPrefix")
    ),
    "shared_devices_allocation_policy": _Override(
        "SHARED_DEVICES_ALLOCATION_POLICY", ("flags", "plugin", "sharedDevicesAllocationPolicy")
    ),
}
# Overridable settings: CLI key (the flag is `--` + the key with '-' for '_') -> env variable.
ENV_OVERRIDES: Mapping[str, str] = MappingProxyType({k: o.env for k, o in _OVERRIDES.items()})
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, and reads `1:0` (a MIG index) and `2024-01-01` as
    strings rather than as YAML 1.1's base-60 integer 60 and a date."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if not tag.endswith(("int", "timestamp"))]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^[-+]?(0b[01_]+|0[0-7_]+|0|[1-9][0-9_]*|0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


def read_text(path: str) -> str:
    """A config file's text; a file that cannot be read is an error naming it and why."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(path, f"cannot read config file: {reason}") from exc


def read_file(path: str) -> dict[str, object]:
    """`read_document` on a file's text."""
    return read_document(read_text(path), path)


def read_document(text: str, source: str) -> dict[str, object]:
    """JSON or YAML text -> its top-level mapping; an empty document is an empty mapping. JSON is
    tried first, as its error messages are clearer for JSON than YAML's."""
    document: object
    try:
        document = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        if not text.lstrip().startswith("{"):
            document = _read_yaml(text, source)
        else:
            try:  # a YAML flow mapping such as {version: v1} is not JSON
                document = yaml.load(text, Loader=_Loader)
            except yaml.YAMLError:
                where = f"line {exc.lineno}, column {exc.colno}"
                raise ConfigError("", f"{source}: invalid JSON at {where}: {exc.msg}") from exc
    except ValueError as exc:  # a duplicate key, from _unique_pairs
        raise ConfigError("", f"{source}: invalid JSON: {exc}") from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError("", f"{source}: the config must be a mapping, got {describe(document)}")
    return document


def _read_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError("", f"{source}: invalid YAML{where}: {problem}") from exc


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key '{key}'")
        result[key] = value
    return result


@dataclass
class KeyScan:
    """What `scan_keys` found: the document without unused keys, typos, and unused keys set."""

    known: dict[str, object] = field(default_factory=dict)
    unknown: list[tuple[str, str]] = field(default_factory=list)  # (path, message)
    unused: dict[str, object] = field(default_factory=dict)  # path -> value as written


def scan_keys(document: Mapping[str, object]) -> KeyScan:
    """Check every mapping key of `document` against SCHEMA. Keys whose value is null count as
    absent and are dropped (as the reference reads them); unused keys are moved to `unused`."""
    scan = KeyScan()
    known = _walk(document, SCHEMA, "", scan)
    assert isinstance(known, dict)
    scan.known = known
    return scan


def _walk(value: object, shape: Shape, path: str, scan: KeyScan) -> object:
    if isinstance(shape, Mapping) and isinstance(value, Mapping):
        kept: dict[str, object] = {}
        for key, child in value.items():
            if not isinstance(key, str) or key not in shape:
                name = key if isinstance(key, str) else repr(key)
                scan.unknown.append((join(path, name), _unknown_message(key, shape)))
                continue
            if child is None:
                continue
            child_path = join(path, key)
            walked = _walk(child, shape[key], child_path, scan)
            if child_path in UNUSED:
                scan.unused[child_path] = walked
            else:
                kept[key] = walked
        return kept
    if isinstance(shape, list) and isinstance(value, list):
        return [_walk(item, shape[0], f"{path}[{i}]", scan) for i, item in enumerate(value)]
    return value


def _unknown_message(key: object, shape: Mapping[str, Shape]) -> str:
    known = list(shape)
    if not isinstance(key, str):
        return f"unknown key {key!r}: keys must be strings (known keys here: {', '.join(known)})"
    folded = {_fold(name): name for name in known}
    match = folded.get(_fold(key)) or next(
        iter(difflib.get_close_matches(key, known, n=1, cutoff=0.7)), None
    )
    if match:
        return f"unknown key '{key}' (did you mean '{match}'?)"
    return f"unknown key '{key}' (known keys here: {', '.join(known)})"


def _fold(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


@dataclass(frozen=True)
class Given:
    """One override that was given: the document path it sets, its value, and its source."""

    path: str  # dotted, e.g. flags.plugin.deviceListStrategy
    value: object
    label: str  # the flag (--mig-strategy) or environment variable (MIG_STRATEGY)


def given_overrides(cli: Mapping[str, str | None], env: Mapping[str, str]) -> list[Given]:
    """The overrides given, a flag beating its variable. A flag is given unless None; a variable
    unless unset or empty. Raises ConfigError naming the flag or variable for a bad boolean."""
    found: list[Given] = []
    for key, override in _OVERRIDES.items():
        flag, variable = cli.get(key), env.get(override.env)
        if flag is not None:
            label, raw = "--" + key.replace("_", "-"), flag
        elif variable:
            label, raw = override.env, variable
        else:
            continue
        value: object = raw
        if override.kind == "bool":
            if raw.strip().lower() not in _BOOLEANS:
                raise ConfigError(label, f"must be true or false (or 1/0, yes/no), got '{raw}'")
            value = _BOOLEANS[raw.strip().lower()]
        elif override.kind == "list":
            value = [item.strip() for item in raw.split(",") if item.strip()]
        found.append(Given(".".join(override.path), value, label))
    return found


def put(document: dict[str, object], path: str, value: object) -> None:
    """Set the value at a dotted path, creating sections; a section of the wrong type is left
    as it is, for validation to report."""
    *sections, last = path.split(".")
    for key in sections:
        child = document.setdefault(key, {})
        if not isinstance(child, dict):
            return
        document = child
    document[last] = value


def describe(value: object) -> str:
    """A value as an error message shows it: 'text', 2, true, null, a list, a mapping."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, int | float):
        return repr(value)
    return "a list" if isinstance(value, list | tuple) else "a mapping"


def join(path: str, key: str) -> str:
    """`flags` + `migStrategy` -> `flags.migStrategy`; the root is the empty path."""
    return f"{path}.{key}" if path else key
