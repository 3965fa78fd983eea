"""The raw config document, before the typed models see it: text in, keys checked, overrides in.

`read_document` parses JSON or YAML, rejecting duplicate keys and keeping YAML 1.1 from reading
the MIG index `1:0` as the base-60 number 60. `scan_keys` checks every key against the key tree of
the reference plugin's v1 schema: a key no version defines is an error naming its path (with a
did-you-mean); a key it defines that this plugin does not act on is set aside for a warning.
`given_overrides` turns flags and environment variables into values at document paths.

The file is untrusted input that a reload reads while the plugin serves (`node.configread` reads
at most `MAX_CONFIG_BYTES` of it): `read_document` refuses documents with no content, nesting
too deep or aliases that expand beyond what the file could hold, and every message that repeats
input shows at most `QUOTE_LIMIT` characters of it (`quote`, `describe`). Messages do quote the
document, as pointing at the offending value is what makes them useful: it is only ever a
config (`node.configread` refuses a `--config-dir` entry leading outside the directory unread).
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Mapping
from dataclasses import field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from deviceplugin.model.errors import ConfigError
from deviceplugin.model.record import record
from deviceplugin.model.yamlimport import yaml

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
    "flags.useNodeFeatureAPI": "it configures gpu-feature-discovery",
    "flags.deviceDiscoveryStrategy": "devices are always discovered through NVML",
    "flags.gfd": "it configures gpu-feature-discovery",
    "flags.plugin.nvidiaCTKPath": "only the reference's own CDI spec generation uses it",
    "flags.plugin.containerDriverRoot": "only the reference's own CDI spec generation uses it",
    "imex": "IMEX channels are not supported",
}


@record(frozen=True)
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
    "mps_root": _Override("MPS_ROOT", ("flags", "mpsRoot")),
    "cdi_annotation_prefix": _Override(
        "CDI_ANNOTATION_PREFIX", ("flags", "plugin", "cdiAnnotationPrefix")
    ),
    "gdrcopy_enabled": _Override("GDRCOPY_ENABLED", ("flags", "gdrcopyEnabled"), "bool"),
    "gds_enabled": _Override("GDS_ENABLED", ("flags", "gdsEnabled"), "bool"),
    "mofed_enabled": _Override("MOFED_ENABLED", ("flags", "mofedEnabled"), "bool"),
    "shared_devices_allocation_policy": _Override(
        "SHARED_DEVICES_ALLOCATION_POLICY", ("flags", "plugin", "sharedDevicesAllocationPolicy")
    ),
}
# Overridable settings: CLI key (the flag is `--` + the key with '-' for '_') -> env variable.
ENV_OVERRIDES: Mapping[str, str] = MappingProxyType({k: o.env for k, o in _OVERRIDES.items()})
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


MAX_CONFIG_BYTES = 1024 * 1024  # a ConfigMap holds at most 1 MiB
MAX_DEPTH = 64  # the schema nests 6 levels; anything far deeper is not a config
# What a document may expand to, in values plus characters: a file of MAX_CONFIG_BYTES holds at
# most about this much without YAML aliases, which can repeat an anchor's content without end.
MAX_EXPANDED = 4 * MAX_CONFIG_BYTES
QUOTE_LIMIT = 200  # characters of an input value a message repeats
_FOR_DEFAULTS = "a file that says 'version: v1' gives the defaults"


class _NoDuplicates:
    """Rejects duplicate mapping keys (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {_shown_key(key)}", key_node.start_mark
                    )
                seen.add(key)
        return yaml.SafeLoader.construct_mapping(self, node, deep)  # type: ignore[arg-type]


class _Loader(_NoDuplicates, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader (libyaml's when PyYAML has it: about 3x faster on a large file) that
    rejects duplicate keys, and reads `1:0` (a MIG index) and `2024-01-01` as strings rather than
    as YAML 1.1's base-60 integer 60 and a date."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if not tag.endswith(("int", "timestamp"))]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^[-+]?(0b[01_]+|0[0-7_]+|0|[1-9][0-9_]*|0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


def read_document(text: str, source: str) -> dict[str, object]:
    """JSON or YAML text -> its top-level mapping. A document with no content (an empty file,
    only blanks or comments, `null`) is an error: the defaults are asked for with `version: v1`,
    so a file emptied by mistake cannot silently drop every setting. JSON is tried first, as its
    error messages are clearer for JSON than YAML's."""
    if not text.strip():
        raise ConfigError("", f"{source}: the config is empty; {_FOR_DEFAULTS}")
    try:
        document = _parse(text, source)
    except RecursionError:
        raise ConfigError("", f"{source}: nested too deeply to be a config") from None
    if document is None:
        raise ConfigError(
            "", f"{source}: the config has no content (only comments or null); {_FOR_DEFAULTS}"
        )
    if not isinstance(document, dict):
        raise ConfigError("", f"{source}: the config must be a mapping, got {describe(document)}")
    _check_extent(document, source)
    return document


def read_untrusted(text: str, source: str) -> object:
    """JSON or YAML text of any shape from a file this process does not trust (a simulated node
    as well as a config): duplicate keys refused, nesting and alias expansion bounded alike."""
    try:
        document = _parse(text, source)
    except RecursionError:
        raise ConfigError("", f"{source}: nested too deeply") from None
    _check_extent(document, source)
    return document


def _parse(text: str, source: str) -> object:
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        if not text.lstrip().startswith("{"):
            return _read_yaml(text, source)
        try:  # a YAML flow mapping such as {version: v1} is not JSON
            return _load_yaml(text)
        except (yaml.YAMLError, ValueError):
            where = f"line {exc.lineno}, column {exc.colno}"
            raise ConfigError("", f"{source}: invalid JSON at {where}: {exc.msg}") from None
    except ValueError as exc:  # a duplicate key, from _unique_pairs, or an overlong number
        raise ConfigError("", f"{source}: invalid JSON: {exc}") from None


def _load_yaml(text: str) -> object:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects


def _read_yaml(text: str, source: str) -> object:
    try:
        return _load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        # a problem may repeat input (a tag); ours (a duplicate key) quote it short already
        problem = _clip(problem, 3 * QUOTE_LIMIT)
        raise ConfigError("", f"{source}: invalid YAML{where}: {problem}") from None
    except ValueError as exc:  # a value PyYAML cannot convert, e.g. an integer of 5000 digits
        raise ConfigError("", f"{source}: invalid YAML: {_clip(str(exc))}") from None


def _check_extent(document: object, source: str) -> None:
    """Refuse a document nested deeper than MAX_DEPTH or expanding (through aliases) beyond
    MAX_EXPANDED values and characters; walked without recursion, stopping at the limit."""
    budget = MAX_EXPANDED
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError("", f"{source}: nested deeper than {MAX_DEPTH} levels")
        budget -= 1 + (len(value) if isinstance(value, str | bytes) else 0)
        if budget < 0:
            raise ConfigError(
                "",
                f"{source}: the document expands to more than {MAX_EXPANDED} values and "
                "characters, more than a 1 MiB file holds (YAML aliases repeat their anchor "
                "each time they are used)",
            )
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, list | tuple | set | frozenset):
            stack.extend((item, depth + 1) for item in value)


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {quote(key)}")
        result[key] = value
    return result


@record
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
                name = _clip(key) if isinstance(key, str) else _shown_key(key)
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
        return (
            f"unknown key {_shown_key(key)}: keys must be strings "
            f"(known keys here: {', '.join(known)})"
        )
    folded = {_fold(name): name for name in known}
    import difflib  # only to suggest a key for one that is wrong

    close = difflib.get_close_matches(key, known, n=1, cutoff=0.7) if len(key) <= 64 else []
    match = folded.get(_fold(key)) or next(iter(close), None)
    if match:
        return f"unknown key {quote(key)} (did you mean '{match}'?)"
    return f"unknown key {quote(key)} (known keys here: {', '.join(known)})"


def _fold(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


@record(frozen=True)
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
                allowed = "must be true or false (or 1/0, yes/no)"
                raise ConfigError(label, f"{allowed}, got {quote(raw)}")
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
    """A value as an error message shows it: 'text', 2, true, null, a list, a mapping; a long
    string or number is cut to QUOTE_LIMIT characters and says how long it was."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, int):
        digits = len(str(abs(value))) if value.bit_length() < 10_000 else None
        if digits is not None and digits <= QUOTE_LIMIT:
            return repr(value)
        return f"an integer of {digits or 'over 3000'} digits"
    if isinstance(value, float):
        return repr(value)
    return "a list" if isinstance(value, list | tuple) else "a mapping"


def quote(text: str) -> str:
    """`'text'`, or for a text longer than QUOTE_LIMIT its start and its length:
    `'aaaa…' (5242880 characters)`."""
    if len(text) <= QUOTE_LIMIT:
        return f"'{text}'"
    return f"'{text[:QUOTE_LIMIT]}…' ({len(text)} characters)"


def _clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """Text cut to `limit` characters, with its length, for use unquoted (a path)."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _shown_key(key: object) -> str:
    """A mapping key as a message shows it, cut like any other input."""
    if isinstance(key, str | bool | int | float) or key is None:
        return describe(key)
    return _clip(repr(key))


def join(path: str, key: str) -> str:
    """`flags` + `migStrategy` -> `flags.migStrategy`; the root is the empty path."""
    return f"{path}.{key}" if path else key
