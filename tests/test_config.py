"""The v1 config: example files, values, error paths, warnings, and flag > env > file > default."""

from __future__ import annotations

import json
import os
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugin.model.config import (
    ENV_OVERRIDES,
    MAX_REPLICAS,
    Config,
    ParsedConfig,
    load_config_text,
    parse_config,
    summary,
)
from deviceplugin.model.config_keys import MAX_CONFIG_BYTES, QUOTE_LIMIT
from deviceplugin.model.errors import ConfigError
from deviceplugin.node.configread import load_config, read_text

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
EXAMPLES = sorted(CONFIG_DIR.glob("*.yaml"))
UUID = "b1028956-cfa2-0990-bf4a-5da9abb51763"


def shared(replicas: str, **extra: str) -> str:
    """A document sharing nvidia.com/gpu; `extra` adds keys to the resource entry."""
    keys = "".join(f", {key}: {value}" for key, value in extra.items())
    return f"sharing: {{timeSlicing: {{resources: [{{name: gpu, replicas: {replicas}{keys}}}]}}}}"


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return caught.value


# --- example files -------------------------------------------------------------------------------


def test_every_expected_example_exists() -> None:
    names = {path.name for path in EXAMPLES}
    expected = {"default.yaml", "time-slicing.yaml", "mig-mixed.yaml", "seed.yaml"}
    assert expected | {"dedicated-and-shared.yaml", "cdi.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_example_is_valid_without_warnings(path: Path) -> None:
    parsed = load_config(str(path), {}, {})
    assert parsed.warnings == ()
    assert parsed.config == parse_config(path.read_text(), source=str(path)).config
    assert summary(parsed.config).startswith("valid v1 config: ")


@pytest.mark.parametrize(
    ("name", "expected_summary"),
    [
        pytest.param(
            "default.yaml",
            "valid v1 config: migStrategy=none, deviceListStrategy=envvar, no sharing",
            id="default",
        ),
        pytest.param(
            "seed.yaml",
            "valid v1 config: migStrategy=mixed, deviceListStrategy=envvar, "
            "time-slicing nvidia.com/gpu x2",
            id="seed",
        ),
        pytest.param(
            "time-slicing.yaml",
            "valid v1 config: migStrategy=none, deviceListStrategy=envvar, "
            "time-slicing nvidia.com/gpu x4",
            id="time-slicing",
        ),
        pytest.param(
            "mig-mixed.yaml",
            "valid v1 config: migStrategy=mixed, deviceListStrategy=envvar, "
            "time-slicing nvidia.com/mig-1g.10gb x2",
            id="mig-mixed",
        ),
        pytest.param(
            "dedicated-and-shared.yaml",
            "valid v1 config: migStrategy=none, "
            "deviceListStrategy=envvar, time-slicing nvidia.com/gpu[0,1] x4 as "
            "nvidia.com/gpu.shared",
            id="dedicated-and-shared",
        ),
        pytest.param(
            "cdi.yaml",
            "valid v1 config: migStrategy=none, deviceListStrategy=cdi-cri, no sharing",
            id="cdi",
        ),
    ],
)
def test_example_summary(name: str, expected_summary: str) -> None:
    assert summary(load_config(str(CONFIG_DIR / name), {}, {}).config) == expected_summary


def test_seed_is_exactly_the_seed_configmap() -> None:
    config = load_config(str(CONFIG_DIR / "seed.yaml"), {}, {}).config
    assert config.flags.mig_strategy == "mixed"
    slicing = config.sharing.time_slicing
    assert slicing is not None
    assert [(r.name, r.replicas, r.devices, r.rename) for r in slicing.resources] == [
        ("nvidia.com/gpu", 2, "all", None)
    ]
    assert slicing.rename_by_default is False
    assert slicing.fail_requests_greater_than_one is False
    assert config.flags.plugin == Config().flags.plugin


def test_dedicated_and_shared_selects_devices() -> None:
    config = load_config(str(CONFIG_DIR / "dedicated-and-shared.yaml"), {}, {}).config
    assert config.sharing.time_slicing is not None
    entry = config.sharing.time_slicing.resources[0]
    assert (entry.rename, entry.devices, entry.replicas) == ("nvidia.com/gpu.shared", ("0", "1"), 4)
    assert config.sharing.time_slicing.fail_requests_greater_than_one is True


# --- valid documents and the values they give ----------------------------------------------------


def test_version_v1_alone_is_all_defaults() -> None:
    for text in ("version: v1", "{}", '{"version": ""}'):
        parsed = parse_config(text)
        assert parsed == ParsedConfig(config=Config(), warnings=())
    config = Config()
    assert config.version == "v1"
    assert config.flags.mig_strategy == "none"
    assert config.flags.fail_on_init_error is True
    assert config.flags.nvidia_driver_root == "/"
    assert config.flags.dev_root == "/"
    assert config.flags.plugin.pass_device_specs is False
    assert config.flags.plugin.device_list_strategy == ("envvar",)
    assert config.flags.plugin.device_id_strategy == "uuid"
    assert config.flags.plugin.cdi_annotation_prefix == "cdi.k8s.io/"
    assert config.flags.plugin.shared_devices_allocation_policy == "distributed"
    assert config.resources.gpus == () and config.resources.mig == ()
    assert config.sharing.time_slicing is None


def value_at(config: Config, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value[int(part)] if part.isdigit() else getattr(value, part)
    return value


@pytest.mark.parametrize(
    ("text", "attribute", "expected"),
    [
        pytest.param("version: ''", "version", "v1", id="empty-version-is-v1"),
        pytest.param("flags: {migStrategy: single}", "flags.mig_strategy", "single", id="mig"),
        pytest.param(
            "flags: {failOnInitError: false}", "flags.fail_on_init_error", False, id="fail-on-init"
        ),
        pytest.param(
            "flags: {nvidiaDriverRoot: /run/nvidia/driver}",
            "flags.dev_root",
            "/run/nvidia/driver",
            id="dev-root-follows-driver-root",
        ),
        pytest.param(
            "flags: {nvidiaDriverRoot: /a, nvidiaDevRoot: /b}",
            "flags.dev_root",
            "/b",
            id="dev-root-own",
        ),
        pytest.param(
            "flags: {plugin: {deviceListStrategy: volume-mounts}}",
            "flags.plugin.device_list_strategy",
            ("volume-mounts",),
            id="strategy-string",
        ),
        pytest.param(
            "flags: {plugin: {deviceListStrategy: [envvar, volume-mounts, envvar]}}",
            "flags.plugin.device_list_strategy",
            ("envvar", "volume-mounts"),
            id="strategy-list-deduplicated",
        ),
        pytest.param(
            "flags: {plugin: {deviceIDStrategy: index}}",
            "flags.plugin.device_id_strategy",
            "index",
            id="id-strategy",
        ),
        pytest.param(
            "flags: {plugin: {passDeviceSpecs: true}}",
            "flags.plugin.pass_device_specs",
            True,
            id="pass-device-specs",
        ),
        pytest.param(
            "flags: {plugin: {cdiAnnotationPrefix: example.com/}}",
            "flags.plugin.cdi_annotation_prefix",
            "example.com/",
            id="cdi-prefix",
        ),
        pytest.param(
            "flags: {plugin: {sharedDevicesAllocationPolicy: packed}}",
            "flags.plugin.shared_devices_allocation_policy",
            "packed",
            id="packed",
        ),
        pytest.param(
            "resources: {gpus: [{pattern: '*A100*', name: a100}]}",
            "resources.gpus.0.name",
            "nvidia.com/a100",
            id="gpu-rename-qualified",
        ),
        pytest.param(
            "resources: {mig: [{pattern: 1g.10gb, name: example.com/small}]}",
            "resources.mig.0.name",
            "example.com/small",
            id="mig-rename-own-domain",
        ),
        pytest.param(
            shared("2"),
            "sharing.time_slicing.resources.0.name",
            "nvidia.com/gpu",
            id="short-name-qualified",
        ),
        pytest.param(
            shared("2", rename="gpu.shared"),
            "sharing.time_slicing.resources.0.rename",
            "nvidia.com/gpu.shared",
            id="short-rename-qualified",
        ),
        pytest.param(
            shared("2"), "sharing.time_slicing.resources.0.devices", "all", id="devices-default-all"
        ),
        pytest.param(
            shared("2", devices=f"[0, '1', 1, 2:0, 1:0, GPU-{UUID}, MIG-{UUID}]"),
            "sharing.time_slicing.resources.0.devices",
            ("0", "1", "2:0", "1:0", f"GPU-{UUID}", f"MIG-{UUID}"),
            id="devices-mixed-list",
        ),
        pytest.param(
            shared("2", devices="3"),
            "sharing.time_slicing.resources.0.devices",
            3,
            id="devices-count",
        ),
        pytest.param(
            shared("2"),
            "sharing.time_slicing.rename_by_default",
            False,
            id="rename-by-default-false",
        ),
        pytest.param(
            shared("2"),
            "sharing.time_slicing.fail_requests_greater_than_one",
            False,
            id="fail-requests-default-false",
        ),
        pytest.param(
            f"sharing: {{timeSlicing: null}}\n{'flags: {migStrategy: mixed}'}",
            "sharing.time_slicing",
            None,
            id="null-section-is-absent",
        ),
        pytest.param(
            "flags:\n  migStrategy:\n  plugin:\n",
            "flags.mig_strategy",
            "none",
            id="null-values-are-defaults",
        ),
    ],
)
def test_valid_values(text: str, attribute: str, expected: object) -> None:
    assert value_at(parse_config(text).config, attribute) == expected


def test_mig_index_1_0_stays_a_string() -> None:
    # YAML 1.1 reads 1:0 as the base-60 integer 60; a MIG index must stay "1:0".
    config = parse_config(shared("2", devices="[1:0, 12:30]")).config
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].devices == ("1:0", "12:30")


def test_yaml_anchors_and_merge_keys() -> None:
    text = """
sharing:
  timeSlicing:
    resources:
      - &base {name: gpu, replicas: 3}
      - {<<: *base, name: mig-1g.10gb}
"""
    slicing = parse_config(text).config.sharing.time_slicing
    assert slicing is not None
    assert [(r.name, r.replicas) for r in slicing.resources] == [
        ("nvidia.com/gpu", 3),
        ("nvidia.com/mig-1g.10gb", 3),
    ]


def test_json_document() -> None:
    document = {
        "version": "v1",
        "flags": {"migStrategy": "single", "plugin": {"deviceListStrategy": ["cdi-annotations"]}},
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 8}]}},
    }
    config = parse_config(json.dumps(document, indent="\t")).config  # tabs: JSON, not YAML
    assert config.flags.mig_strategy == "single"
    assert config.flags.plugin.device_list_strategy == ("cdi-annotations",)
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].replicas == 8


def test_yaml_flow_mapping_that_is_not_json() -> None:
    assert parse_config("{flags: {migStrategy: mixed}}").config.flags.mig_strategy == "mixed"


def test_config_is_frozen() -> None:
    config = Config()
    with pytest.raises(FrozenInstanceError):
        config.version = "v1"  # type: ignore[misc]


# --- invalid documents: the path of the first offending field ------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        # types
        pytest.param(
            shared("'2'"),
            "sharing.timeSlicing.resources[0].replicas",
            "must be an integer, got '2' (a quoted string)",
            id="replicas-string",
        ),
        pytest.param(
            shared("2.5"),
            "sharing.timeSlicing.resources[0].replicas",
            "must be an integer, got 2.5",
            id="replicas-float",
        ),
        pytest.param(
            shared("true"),
            "sharing.timeSlicing.resources[0].replicas",
            "must be an integer, got true",
            id="replicas-bool",
        ),
        pytest.param(
            "flags: {failOnInitError: 'true'}",
            "flags.failOnInitError",
            "must be true or false",
            id="bool-quoted",
        ),
        pytest.param(
            "flags: {failOnInitError: 1}",
            "flags.failOnInitError",
            "must be true or false, got 1",
            id="bool-number",
        ),
        pytest.param("flags: 5", "flags", "must be a mapping, got 5", id="flags-scalar"),
        pytest.param("flags: [a]", "flags", "must be a mapping, got a list", id="flags-list"),
        pytest.param(
            "flags: {nvidiaDriverRoot: 7}",
            "flags.nvidiaDriverRoot",
            "must be a string, got 7",
            id="root-number",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: {name: gpu}}}",
            "sharing.timeSlicing.resources",
            "must be a list, got a mapping",
            id="resources-mapping",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [gpu]}}",
            "sharing.timeSlicing.resources[0]",
            "must be a mapping, got 'gpu'",
            id="resource-scalar",
        ),
        pytest.param(
            "resources: {gpus: {pattern: '*', name: gpu}}",
            "resources.gpus",
            "must be a list",
            id="gpus-mapping",
        ),
        # values
        pytest.param("version: v2", "version", "unknown version 'v2'", id="version-v2"),
        pytest.param("version: 1", "version", "must be 'v1', got 1", id="version-number"),
        pytest.param(
            "flags: {migStrategy: foo}",
            "flags.migStrategy",
            "must be 'none', 'single' or 'mixed', got 'foo'",
            id="mig-strategy",
        ),
        pytest.param(
            "flags: {plugin: {deviceIDStrategy: serial}}",
            "flags.plugin.deviceIDStrategy",
            "got 'serial'",
            id="id-strategy",
        ),
        pytest.param(
            "flags: {plugin: {sharedDevicesAllocationPolicy: spread}}",
            "flags.plugin.sharedDevicesAllocationPolicy",
            "'distributed' or 'packed'",
            id="allocation-policy",
        ),
        pytest.param(
            "flags: {plugin: {deviceListStrategy: [envvar, mounts]}}",
            "flags.plugin.deviceListStrategy[1]",
            "got 'mounts'",
            id="strategy-item",
        ),
        pytest.param(
            "flags: {plugin: {deviceListStrategy: []}}",
            "flags.plugin.deviceListStrategy",
            "at least one strategy",
            id="strategy-empty",
        ),
        pytest.param(
            "flags: {plugin: {deviceListStrategy: [cdi-annotations, cdi-cri]}}",
            "flags.plugin.deviceListStrategy",
            "choose one",
            id="strategy-both-cdi",
        ),
        pytest.param(
            "flags: {plugin: {cdiAnnotationPrefix: cdi.k8s.io}}",
            "flags.plugin.cdiAnnotationPrefix",
            "followed by '/'",
            id="cdi-prefix",
        ),
        pytest.param(
            "flags: {nvidiaDriverRoot: run/nvidia}",
            "flags.nvidiaDriverRoot",
            "absolute path",
            id="relative-root",
        ),
        pytest.param(
            "flags: {nvidiaDevRoot: dev}",
            "flags.nvidiaDevRoot",
            "absolute path",
            id="relative-dev-root",
        ),
        pytest.param(
            shared("1"),
            "sharing.timeSlicing.resources[0].replicas",
            "must be >= 2, got 1",
            id="replicas-1",
        ),
        pytest.param(
            shared("-3"),
            "sharing.timeSlicing.resources[0].replicas",
            "must be >= 2, got -3",
            id="replicas-negative",
        ),
        pytest.param(
            shared(str(MAX_REPLICAS + 1)),
            "sharing.timeSlicing.resources[0].replicas",
            f"must be <= {MAX_REPLICAS}",
            id="replicas-huge",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: gpu}]}}",
            "sharing.timeSlicing.resources[0].replicas",
            "is required",
            id="replicas-missing",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{replicas: 2}]}}",
            "sharing.timeSlicing.resources[0].name",
            "is required",
            id="name-missing",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: []}}",
            "sharing.timeSlicing.resources",
            "no resources specified",
            id="resources-empty",
        ),
        pytest.param(
            "sharing: {timeSlicing: {renameByDefault: true}}",
            "sharing.timeSlicing.resources",
            "no resources specified",
            id="resources-missing",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}, "
            "{name: nvidia.com/gpu, replicas: 4}]}}",
            "sharing.timeSlicing.resources[1].name",
            "already shared by resources[0]",
            id="duplicate-name",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, rename: shared}, "
            "{name: mig-1g.10gb, replicas: 2, rename: shared}]}}",
            "sharing.timeSlicing.resources[1].rename",
            "nvidia.com/shared is already",
            id="duplicate-rename",
        ),
        pytest.param(
            "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 2},"
            " {name: mig-1g.10gb, replicas: 2, rename: gpu.shared}]}}",
            "sharing.timeSlicing.resources[1].rename",
            "nvidia.com/gpu.shared is already",
            id="rename-clashes-with-default-rename",
        ),
        # resource names
        pytest.param(
            shared("2", rename="Example.com/gpu"),
            "sharing.timeSlicing.resources[0].rename",
            "lower-case DNS domain",
            id="upper-case-domain",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: GPU, replicas: 2}]}}",
            "sharing.timeSlicing.resources[0].name",
            "lower-case letters",
            id="upper-name",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: a/b/c, replicas: 2}]}}",
            "sharing.timeSlicing.resources[0].name",
            "'domain/name'",
            id="two-slashes",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: example.com/, replicas: 2}]}}",
            "sharing.timeSlicing.resources[0].name",
            "lower-case letters",
            id="no-name",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: example.com/-x, replicas: 2}]}}",
            "sharing.timeSlicing.resources[0].name",
            "starting and ending",
            id="name-starts-with-dash",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: '', replicas: 2}]}}",
            "sharing.timeSlicing.resources[0].name",
            "lower-case letters",
            id="empty-name",
        ),
        pytest.param(
            shared("2", rename="kubernetes.io/gpu"),
            "sharing.timeSlicing.resources[0].rename",
            "reserved",
            id="kubernetes-io",
        ),
        pytest.param(
            shared("2", rename="foo.kubernetes.io/gpu"),
            "sharing.timeSlicing.resources[0].rename",
            "reserved",
            id="kubernetes-io-subdomain",
        ),
        pytest.param(
            shared("2", rename="gpu" + "x" * 50),
            "sharing.timeSlicing.resources[0].rename",
            "longer than 63 characters",
            id="name-too-long",
        ),
        pytest.param(
            "resources: {gpus: [{pattern: '*', name: Gpu}]}",
            "resources.gpus[0].name",
            "lower-case letters",
            id="gpus-name",
        ),
        pytest.param(
            "resources: {mig: [{pattern: 1g.10gb, name: x/y/z}]}",
            "resources.mig[0].name",
            "'domain/name'",
            id="mig-name",
        ),
        pytest.param(
            "resources: {mig: [{name: small}]}",
            "resources.mig[0].pattern",
            "is required",
            id="pattern-missing",
        ),
        pytest.param(
            "resources: {gpus: [{pattern: '', name: gpu}]}",
            "resources.gpus[0].pattern",
            "must not be empty",
            id="pattern-empty",
        ),
        # devices
        pytest.param(
            shared("2", devices="0"),
            "sharing.timeSlicing.resources[0].devices",
            "a count of devices must be > 0, got 0",
            id="devices-count-zero",
        ),
        pytest.param(
            shared("2", devices="some"),
            "sharing.timeSlicing.resources[0].devices",
            "must be 'all', a count of devices, or a list",
            id="devices-string",
        ),
        pytest.param(
            shared("2", devices="[]"),
            "sharing.timeSlicing.resources[0].devices",
            "at least one device",
            id="devices-empty",
        ),
        pytest.param(
            shared("2", devices="[0, gpu1]"),
            "sharing.timeSlicing.resources[0].devices[1]",
            "got 'gpu1'",
            id="devices-bad-id",
        ),
        pytest.param(
            shared("2", devices="[-1]"),
            "sharing.timeSlicing.resources[0].devices[0]",
            "got -1",
            id="devices-negative",
        ),
        pytest.param(
            shared("2", devices="[true]"),
            "sharing.timeSlicing.resources[0].devices[0]",
            "got true",
            id="devices-bool",
        ),
        pytest.param(
            shared("2", devices="[[0]]"),
            "sharing.timeSlicing.resources[0].devices[0]",
            "got a list",
            id="devices-nested",
        ),
        # sharing.mps is checked as timeSlicing is
        pytest.param(
            "sharing: {mps: {resources: [{name: gpu, replicas: 1}]}}",
            "sharing.mps.resources[0].replicas",
            "must be >= 2",
            id="mps-replicas",
        ),
    ],
)
def test_invalid(text: str, path: str, fragment: str) -> None:
    error = error_of(text)
    assert error.path == path
    assert fragment in error.message


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        pytest.param(
            shared("2", replica="2"),
            "sharing.timeSlicing.resources[0].replica",
            "unknown key 'replica' (did you mean 'replicas'?)",
            id="replica",
        ),
        pytest.param(
            "flags: {migStrategyy: mixed}",
            "flags.migStrategyy",
            "unknown key 'migStrategyy' (did you mean 'migStrategy'?)",
            id="mig-typo",
        ),
        pytest.param(
            "flags: {mig_strategy: mixed}",
            "flags.mig_strategy",
            "unknown key 'mig_strategy' (did you mean 'migStrategy'?)",
            id="snake-case",
        ),
        pytest.param(
            "flags: {plugin: {deviceIdStrategy: index}}",
            "flags.plugin.deviceIdStrategy",
            "unknown key 'deviceIdStrategy' (did you mean 'deviceIDStrategy'?)",
            id="case",
        ),
        pytest.param(
            "sharing: {timeslicing: {resources: []}}",
            "sharing.timeslicing",
            "unknown key 'timeslicing' (did you mean 'timeSlicing'?)",
            id="timeslicing",
        ),
        pytest.param(
            "flags: {gfd: {oneshott: true}}",
            "flags.gfd.oneshott",
            "unknown key 'oneshott' (did you mean 'oneshot'?)",
            id="inside-unused",
        ),
        pytest.param(
            "imex: {channelIds: [0]}",
            "imex.channelIds",
            "unknown key 'channelIds' (did you mean 'channelIDs'?)",
            id="imex",
        ),
        pytest.param(
            "colour: blue",
            "colour",
            "unknown key 'colour' (known keys here: version, flags, resources, sharing, imex)",
            id="no-close-match",
        ),
        pytest.param(
            "resources: {gpus: [{pattern: '*', name: gpu, count: 1}]}",
            "resources.gpus[0].count",
            "unknown key 'count' (known keys here: pattern, name)",
            id="in-list-item",
        ),
    ],
)
def test_unknown_keys(text: str, path: str, message: str) -> None:
    error = error_of(text)
    assert (error.path, error.message) == (path, message)


def test_first_error_is_the_path_and_the_rest_are_counted() -> None:
    error = error_of("flags: {migStrategy: foo, failOnInitError: 'yes'}\n" + shared("1"))
    assert error.path == "flags.migStrategy"
    assert "and 2 more errors" in error.message
    assert "flags.failOnInitError: must be true or false" in error.message
    assert "sharing.timeSlicing.resources[0].replicas: must be >= 2, got 1" in error.message
    assert str(error).startswith("flags.migStrategy: must be 'none', 'single' or 'mixed'")


def test_every_unknown_key_is_reported() -> None:
    error = error_of("flags: {migStrategyy: mixed}\ncolour: blue")
    assert error.path == "flags.migStrategyy"
    assert "colour: unknown key 'colour'" in error.message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param(
            "version: v1\nversion: v1\n",
            "line 2, column 1: duplicate key 'version'",
            id="duplicate-yaml-key",
        ),
        pytest.param(
            '{"version": "v1", "version": "v1"}', "duplicate key 'version'", id="duplicate-json-key"
        ),
        pytest.param("flags: [\n", "invalid YAML at line 2", id="broken-yaml"),
        pytest.param('{"flags": {"migStrategy": }', "invalid JSON at line 1", id="broken-json"),
        pytest.param("- a\n- b\n", "must be a mapping, got a list", id="top-level-list"),
        pytest.param("just text", "must be a mapping, got 'just text'", id="top-level-scalar"),
        pytest.param("version: v1\n---\nversion: v1\n", "invalid YAML", id="two-documents"),
        pytest.param("1: x", "unknown key 1: keys must be strings", id="number-key"),
    ],
)
def test_unreadable_documents(text: str, fragment: str) -> None:
    error = error_of(text)
    assert fragment in str(error)


def test_syntax_error_names_the_source() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("flags: [\n", source="/etc/dp/config.yaml")
    assert caught.value.path == ""
    assert caught.value.message.startswith("/etc/dp/config.yaml: invalid YAML")


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(str(missing), {}, {})
    assert caught.value.path == str(missing)
    assert "cannot read config file" in caught.value.message


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(str(tmp_path), {}, {})  # a directory
    assert caught.value.path == str(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(str(binary), {}, {})


# --- known but unused keys: accepted with warnings -----------------------------------------------


@pytest.mark.parametrize(
    ("text", "warnings"),
    [
        pytest.param(
            "imex: {channelIDs: [0], required: true}",
            [
                "imex (channelIDs, required): not used by this plugin "
                "(IMEX channels are not supported); ignored"
            ],
            id="imex",
        ),
        pytest.param(
            "flags: {gfd: {oneshot: true, sleepInterval: 60s, outputFile: /x}}",
            [
                "flags.gfd (oneshot, sleepInterval, outputFile): not used by this plugin "
                "(it configures gpu-feature-discovery); ignored"
            ],
            id="gfd",
        ),
        pytest.param(
            "flags: {gdrcopyEnabled: true, gdsEnabled: false, mofedEnabled: true, "
            "useNodeFeatureAPI: true, deviceDiscoveryStrategy: auto}",
            [
                "flags.useNodeFeatureAPI: not used by this plugin (it configures "
                "gpu-feature-discovery); ignored",
                "flags.deviceDiscoveryStrategy: not used by this plugin (devices are always "
                "discovered through NVML); ignored",
            ],
            id="flags",
        ),
        pytest.param(
            "flags: {plugin: {nvidiaCTKPath: /usr/bin/nvidia-ctk, containerDriverRoot: /driver}}",
            [
                "flags.plugin.nvidiaCTKPath: not used by this plugin (only the reference's own CDI "
                "spec generation uses it); ignored",
                "flags.plugin.containerDriverRoot: not used by this plugin (only the "
                "reference's own CDI spec generation uses it); ignored",
            ],
            id="plugin",
        ),
        pytest.param("imex: {}\nflags: {gfd: null, mpsRoot: null}", [], id="empty-or-null"),
    ],
)
def test_known_but_unused_keys_warn(text: str, warnings: list[str]) -> None:
    parsed = parse_config(text)
    assert list(parsed.warnings) == warnings
    assert parsed.config.sharing.time_slicing is None


def test_mps_is_acted_on_and_time_slicing_beside_it_is_ignored_with_a_warning() -> None:
    parsed = parse_config(
        "flags: {mpsRoot: /run/nvidia/mps}\n"
        "sharing: {mps: {resources: [{name: gpu, replicas: 4}]}, "
        "timeSlicing: {resources: [{name: gpu, replicas: 2}]}}"
    )
    assert parsed.warnings == (
        "sharing.timeSlicing: ignored, sharing.mps is given too and MPS is acted on "
        "(as the reference does)",
    )
    assert parsed.config.sharing.replicated[1] == "sharing.mps"
    mps = parsed.config.sharing.mps
    assert mps is not None and mps.fail_requests_greater_than_one is True


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        pytest.param("{mpsRoot: run/mps}", "flags.mpsRoot", "absolute path", id="relative"),
        pytest.param("{mpsRoot: ''}", "flags.mpsRoot", "got none", id="empty"),
        pytest.param("{}", "flags.mpsRoot", "got none", id="missing"),
    ],
)
def test_mps_needs_an_absolute_mps_root(text: str, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            f"flags: {text}\nsharing: {{mps: {{resources: [{{name: gpu, replicas: 4}}]}}}}"
        )
    assert caught.value.path == path
    assert words in caught.value.message


def test_a_relative_mps_root_from_the_environment_names_the_field() -> None:
    """The chart sets MPS_ROOT on every pod (as the reference's does): a bad one is refused like
    the file's own, naming the variable and the field it overrides."""
    with pytest.raises(ConfigError) as caught:
        load_config(None, {}, {"MPS_ROOT": "run/nvidia/mps"})
    assert caught.value.path == "MPS_ROOT"
    assert caught.value.message == (
        "must be an absolute path, got 'run/nvidia/mps' (overrides flags.mpsRoot)"
    )


@pytest.mark.parametrize(
    ("root", "words"),
    [
        pytest.param("/dev", "not / or under /dev, /proc, /sys", id="dev"),
        pytest.param("/var/../dev", "a clean absolute path", id="dot-dot"),
    ],
)
def test_an_mps_root_from_the_environment_outside_a_directory_of_its_own_names_both(
    root: str, words: str
) -> None:
    """`/dev` as mpsRoot would hand every MPS container the host's /dev/shm: refused from the
    chart's MPS_ROOT as from the file, naming the variable and the field."""
    with pytest.raises(ConfigError) as caught:
        load_config(None, {}, {"MPS_ROOT": root})
    assert caught.value.path == "MPS_ROOT"
    assert words in caught.value.message
    assert caught.value.message.endswith(f"got '{root}' (overrides flags.mpsRoot)")


def test_an_mps_root_too_long_for_a_resource_s_control_socket_names_the_resource() -> None:
    renamed = f"example.com/{'g' * 51}"  # 63 bytes, the longest resource name
    root = "/var/lib/" + "d" * 22  # 31 bytes: the socket <root>/<renamed>/pipe/control is 108
    text = (
        f"flags: {{mpsRoot: {root}}}\n"
        f"sharing: {{mps: {{resources: [{{name: gpu, rename: {renamed}, replicas: 2}}]}}}}"
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert caught.value.path == "flags.mpsRoot"
    assert caught.value.message == (
        f"too long for the MPS control socket of sharing.mps.resources[0] ({renamed}):"
        f" {root}/{renamed}/pipe/control is 108 bytes long; a unix socket path holds at most 107"
    )
    assert parse_config(text.replace(root, root[:-1])).config  # 107 bytes fit


def test_a_file_without_mps_root_takes_it_from_the_environment() -> None:
    """NVIDIA's MPS example names no mpsRoot: the chart's MPS_ROOT completes it; unset, the file
    is refused as before."""
    text = "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 4}]}}\n"
    config = load_config_text(text, None, {}, {"MPS_ROOT": "/run/nvidia/mps"}).config
    assert config.flags.mps_root == "/run/nvidia/mps"
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, None, {}, {"MPS_ROOT": ""})
    assert caught.value.path == "flags.mpsRoot"


def test_reference_configmap_with_unused_keys_still_applies_what_it_can() -> None:
    text = """
version: v1
flags:
  migStrategy: single
  mpsRoot: /run/nvidia/mps
  gfd: {oneshot: false}
  plugin: {passDeviceSpecs: true, nvidiaCTKPath: /usr/bin/nvidia-ctk}
sharing:
  timeSlicing:
    resources: [{name: gpu, replicas: 3}]
imex: {channelIDs: []}
"""
    parsed = parse_config(text)
    assert parsed.config.flags.mig_strategy == "single"
    assert parsed.config.flags.plugin.pass_device_specs is True
    assert parsed.config.sharing.time_slicing is not None
    assert parsed.config.sharing.time_slicing.resources[0].replicas == 3
    assert parsed.config.flags.mps_root == "/run/nvidia/mps"
    assert [w.split(":")[0].split(" ")[0] for w in parsed.warnings] == [
        "flags.gfd",
        "flags.plugin.nvidiaCTKPath",
        "imex",
    ]


# --- overrides: flag > env > file > default ------------------------------------------------------


def test_env_overrides_table() -> None:
    assert dict(ENV_OVERRIDES) == {
        "mig_strategy": "MIG_STRATEGY",
        "fail_on_init_error": "FAIL_ON_INIT_ERROR",
        "pass_device_specs": "PASS_DEVICE_SPECS",
        "device_list_strategy": "DEVICE_LIST_STRATEGY",
        "device_id_strategy": "DEVICE_ID_STRATEGY",
        "nvidia_driver_root": "NVIDIA_DRIVER_ROOT",
        "nvidia_dev_root": "NVIDIA_DEV_ROOT",
        "mps_root": "MPS_ROOT",
        "cdi_annotation_prefix": "CDI_ANNOTATION_PREFIX",
        "gdrcopy_enabled": "GDRCOPY_ENABLED",
        "gds_enabled": "GDS_ENABLED",
        "mofed_enabled": "MOFED_ENABLED",
        "shared_devices_allocation_policy": "SHARED_DEVICES_ALLOCATION_POLICY",
    }


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\n"
        "flags:\n"
        "  migStrategy: single\n"
        "  failOnInitError: false\n"
        "  nvidiaDriverRoot: /file/driver\n"
        "  mpsRoot: /file/mps\n"
        "  plugin: {passDeviceSpecs: true, deviceListStrategy: volume-mounts,"
        " deviceIDStrategy: index}\n"
    )
    return path


@pytest.mark.parametrize(
    ("key", "flag", "variable", "file_value", "default", "attribute"),
    [
        pytest.param(
            "mig_strategy",
            "mixed",
            "none",
            "single",
            "none",
            "flags.mig_strategy",
            id="mig-strategy",
        ),
        pytest.param(
            "fail_on_init_error",
            "true",
            "0",
            False,
            True,
            "flags.fail_on_init_error",
            id="fail-on-init-error",
        ),
        pytest.param(
            "pass_device_specs",
            "no",
            "YES",
            True,
            False,
            "flags.plugin.pass_device_specs",
            id="pass-device-specs",
        ),
        pytest.param(
            "device_list_strategy",
            "envvar,cdi-cri",
            "cdi-annotations",
            ("volume-mounts",),
            ("envvar",),
            "flags.plugin.device_list_strategy",
            id="device-list-strategy",
        ),
        pytest.param(
            "device_id_strategy",
            "uuid",
            "uuid",
            "index",
            "uuid",
            "flags.plugin.device_id_strategy",
            id="device-id-strategy",
        ),
        pytest.param(
            "nvidia_driver_root",
            "/flag",
            "/env",
            "/file/driver",
            "/",
            "flags.nvidia_driver_root",
            id="driver-root",
        ),
        pytest.param(
            "mps_root",
            "/flag/mps",
            "/env/mps",
            "/file/mps",
            None,
            "flags.mps_root",
            id="mps-root",
        ),
    ],
)
def test_precedence(
    config_file: Path,
    key: str,
    flag: str,
    variable: str,
    file_value: object,
    default: object,
    attribute: str,
) -> None:
    env_name = ENV_OVERRIDES[key]
    expected_env: object = {"0": False, "YES": True}.get(variable, variable)
    if key == "device_list_strategy":
        expected_env = (variable,)
    expected_flag: object = {"true": True, "no": False}.get(flag, flag)
    if key == "device_list_strategy":
        expected_flag = tuple(flag.split(","))

    def effective(path: str | None, cli: dict[str, str | None], env: dict[str, str]) -> object:
        return value_at(load_config(path, cli, env).config, attribute)

    assert effective(None, {}, {}) == default
    assert effective(str(config_file), {key: None}, {}) == file_value
    assert effective(str(config_file), {}, {env_name: variable}) == expected_env
    assert effective(None, {}, {env_name: variable}) == expected_env
    assert effective(str(config_file), {key: flag}, {env_name: variable}) == expected_flag
    assert effective(None, {key: flag}, {}) == expected_flag


def test_remaining_overrides_reach_their_fields() -> None:
    cli: dict[str, str | None] = {
        "nvidia_dev_root": "/dev-root",
        "cdi_annotation_prefix": "example.com/",
        "shared_devices_allocation_policy": "packed",
        "kubelet_dir": "/ignored",  # keys that are not overrides are ignored
    }
    config = load_config(None, cli, {}).config
    assert config.flags.dev_root == "/dev-root"
    assert config.flags.plugin.cdi_annotation_prefix == "example.com/"
    assert config.flags.plugin.shared_devices_allocation_policy == "packed"
    env = {
        "NVIDIA_DEV_ROOT": "/env-dev",
        "CDI_ANNOTATION_PREFIX": "env.example.com/",
        "SHARED_DEVICES_ALLOCATION_POLICY": "distributed",
    }
    config = load_config(None, {}, env).config
    assert config.flags.nvidia_dev_root == "/env-dev"
    assert config.flags.plugin.cdi_annotation_prefix == "env.example.com/"


def test_override_leaves_the_rest_of_the_file(config_file: Path) -> None:
    config = load_config(str(config_file), {"mig_strategy": "mixed"}, {}).config
    assert config.flags.mig_strategy == "mixed"
    assert config.flags.fail_on_init_error is False
    assert config.flags.plugin.device_id_strategy == "index"


def test_empty_env_variable_counts_as_unset(config_file: Path) -> None:
    config = load_config(str(config_file), {}, {"MIG_STRATEGY": "", "PASS_DEVICE_SPECS": ""}).config
    assert config.flags.mig_strategy == "single"
    assert config.flags.plugin.pass_device_specs is True


def test_device_list_override_is_a_comma_list() -> None:
    env = {"DEVICE_LIST_STRATEGY": " envvar , volume-mounts,,envvar "}
    config = load_config(None, {}, env).config
    assert config.flags.plugin.device_list_strategy == ("envvar", "volume-mounts")


@pytest.mark.parametrize(
    ("cli", "env", "path", "fragment"),
    [
        pytest.param(
            {},
            {"MIG_STRATEGY": "foo"},
            "MIG_STRATEGY",
            "got 'foo' (overrides flags.migStrategy)",
            id="env-mig",
        ),
        pytest.param({"mig_strategy": "foo"}, {}, "--mig-strategy", "got 'foo'", id="flag-mig"),
        pytest.param(
            {"mig_strategy": "foo"},
            {"MIG_STRATEGY": "mixed"},
            "--mig-strategy",
            "got 'foo'",
            id="bad-flag-beats-good-env",
        ),
        pytest.param(
            {}, {"PASS_DEVICE_SPECS": "maybe"}, "PASS_DEVICE_SPECS", "got 'maybe'", id="env-bool"
        ),
        pytest.param(
            {"pass_device_specs": "2"}, {}, "--pass-device-specs", "got '2'", id="flag-bool"
        ),
        pytest.param(
            {"fail_on_init_error": ""}, {}, "--fail-on-init-error", "got ''", id="flag-bool-empty"
        ),
        pytest.param(
            {},
            {"DEVICE_LIST_STRATEGY": "envvar,nope"},
            "DEVICE_LIST_STRATEGY",
            "got 'nope'",
            id="env-list-item",
        ),
        pytest.param(
            {},
            {"DEVICE_LIST_STRATEGY": " , "},
            "DEVICE_LIST_STRATEGY",
            "at least one strategy",
            id="env-list-empty",
        ),
        pytest.param(
            {"device_id_strategy": "serial"},
            {},
            "--device-id-strategy",
            "got 'serial'",
            id="flag-id",
        ),
        pytest.param(
            {},
            {"NVIDIA_DRIVER_ROOT": "relative"},
            "NVIDIA_DRIVER_ROOT",
            "absolute path",
            id="env-root",
        ),
        pytest.param(
            {},
            {"CDI_ANNOTATION_PREFIX": "nope"},
            "CDI_ANNOTATION_PREFIX",
            "followed by '/'",
            id="env-prefix",
        ),
        pytest.param(
            {"shared_devices_allocation_policy": "spread"},
            {},
            "--shared-devices-allocation-policy",
            "got 'spread'",
            id="flag-policy",
        ),
    ],
)
def test_invalid_override_names_flag_or_variable(
    cli: dict[str, str | None], env: dict[str, str], path: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, cli, env)
    assert caught.value.path == path
    assert fragment in caught.value.message


def test_file_must_be_valid_even_where_overridden(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags: {migStrategy: foo}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path), {"mig_strategy": "mixed"}, {})
    assert caught.value.path == "flags.migStrategy"


def test_overrides_keep_file_warnings(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags: {gfd: {oneshot: false}}\n")
    parsed = load_config(str(path), {"mig_strategy": "mixed"}, {})
    assert parsed.config.flags.mig_strategy == "mixed"
    assert parsed.warnings == (
        "flags.gfd (oneshot): not used by this plugin (it configures gpu-feature-discovery); "
        "ignored",
    )


def test_override_into_a_section_of_the_wrong_type_reports_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags: {plugin: 5}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path), {"pass_device_specs": "true"}, {})
    assert caught.value.path == "flags.plugin"


# --- hostile and careless files ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "what"),
    [
        pytest.param("", "is empty", id="empty"),
        pytest.param(" \n\t\n", "is empty", id="whitespace"),
        pytest.param("# nothing but a comment\n", "has no content", id="comment"),
        pytest.param("---\n", "has no content", id="document-marker"),
        pytest.param("null", "has no content", id="null"),
    ],
)
def test_a_document_with_no_content_is_an_error(text: str, what: str) -> None:
    error = error_of(text)
    assert error.path == ""
    assert what in error.message
    assert "'version: v1' gives the defaults" in error.message


def test_the_file_must_be_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading would block until someone writes to it
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")  # reading would never end
    cases = {fifo: "a named pipe (FIFO)", zero: "a character device", tmp_path: "a directory"}
    for path, kind in cases.items():
        with pytest.raises(ConfigError) as caught:
            read_text(str(path))
        assert caught.value.path == str(path)
        assert f"it is {kind}, not a regular file" in caught.value.message


def test_a_file_over_a_configmaps_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    head = "version: v1\n#"
    path.write_text(head + "x" * (MAX_CONFIG_BYTES - len(head) - 1) + "\n")
    assert load_config(str(path), {}, {}).config == Config()  # exactly 1 MiB is read
    with path.open("a") as file:
        file.write("x")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path), {}, {})
    assert caught.value.path == str(path)
    assert f"config file is {MAX_CONFIG_BYTES + 1} bytes; the limit is 1048576 bytes (1 MiB" in (
        caught.value.message
    )


HUGE = "x" * 1_000_000  # what a ConfigMap can hold


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        pytest.param(
            f"flags: {{migStrategy: {HUGE}}}",
            "flags.migStrategy",
            f"got '{'x' * QUOTE_LIMIT}…' ({len(HUGE)} characters)",
            id="value",
        ),
        pytest.param(
            f"version: {HUGE}",
            "version",
            f"unknown version '{'x' * QUOTE_LIMIT}…' ({len(HUGE)} characters)",
            id="version",
        ),
        pytest.param(
            f'{{"{HUGE}": 1}}',
            f"{'x' * QUOTE_LIMIT}… ({len(HUGE)} characters)",
            f"unknown key '{'x' * QUOTE_LIMIT}…' ({len(HUGE)} characters)",
            id="key",
        ),
        pytest.param(
            f"version: v1\n? {HUGE}\n: 1\n? {HUGE}\n: 2\n",
            "",
            f"duplicate key '{'x' * QUOTE_LIMIT}…' ({len(HUGE)} characters)",
            id="duplicate-yaml-key",
        ),
        pytest.param(
            f'{{"{HUGE}": 1, "{HUGE}": 2}}',
            "",
            f"duplicate key '{'x' * QUOTE_LIMIT}…' ({len(HUGE)} characters)",
            id="duplicate-json-key",
        ),
        pytest.param(
            shared("2", devices=f"[{HUGE}]"),
            "sharing.timeSlicing.resources[0].devices[0]",
            f"({len(HUGE)} characters)",
            id="device-ref",
        ),
        pytest.param(
            f"flags: {{plugin: {{cdiAnnotationPrefix: {HUGE}}}}}",
            "flags.plugin.cdiAnnotationPrefix",
            f"({len(HUGE)} characters)",
            id="prefix",
        ),
        pytest.param(
            f"resources: {{gpus: [{{pattern: '*', name: {HUGE}}}]}}",
            "resources.gpus[0].name",
            f"({len('nvidia.com/' + HUGE)} characters) is longer than 63 characters",
            id="resource-name",
        ),
        pytest.param(
            f"sharing: {{timeSlicing: {{resources: [{{name: gpu, replicas: {'9' * 5000}}}]}}}}",
            "",
            "invalid YAML",
            id="integer-of-5000-digits",
        ),
        pytest.param(
            f'{{"sharing": {{"timeSlicing": {{"resources": [{{"name": "gpu", "replicas": '
            f"{'9' * 5000}}}]}}}}}}",
            "",
            "invalid JSON",
            id="json-integer-of-5000-digits",
        ),
    ],
)
def test_messages_quote_at_most_a_few_hundred_characters_of_input(
    text: str, path: str, fragment: str
) -> None:
    error = error_of(text)
    assert error.path == path
    assert fragment in error.message
    assert len(str(error)) < 2 * QUOTE_LIMIT + 400


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        pytest.param('{"version": "\\ud800"}', "", "a lone surrogate escape", id="lone-surrogate"),
        pytest.param(
            'flags: {nvidiaDriverRoot: "/run/\\0"}',
            "flags.nvidiaDriverRoot",
            "must not contain a NUL character",
            id="nul-in-path",
        ),
    ],
)
def test_text_that_no_path_or_name_can_hold(text: str, path: str, fragment: str) -> None:
    error = error_of(text)
    assert (error.path, fragment in error.message) == (path, True)


def test_a_bad_boolean_override_is_quoted_short() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {}, {"PASS_DEVICE_SPECS": HUGE})
    assert caught.value.path == "PASS_DEVICE_SPECS"
    assert len(caught.value.message) < 2 * QUOTE_LIMIT + 100


def test_aliases_that_expand_beyond_a_files_worth_are_refused() -> None:
    levels = ["a0: &a0 [" + ", ".join(["xxxxxxxx"] * 10) + "]"]
    levels += [f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]" for n in range(1, 9)]
    text = "flags:\n  gfd:\n" + "".join(f"    {line}\n" for line in levels)
    assert len(text) < 2000
    error = error_of(text)
    assert "the document expands to more than" in error.message


def test_nesting_deeper_than_any_config_is_refused() -> None:
    yaml_text = "version: " + "[" * 100 + "]" * 100
    json_text = '{"version": ' + "[" * 5000 + "]" * 5000 + "}"
    for text in (yaml_text, json_text):
        error = error_of(text)
        assert "nested" in error.message


# --- the reference's accepted and refused inputs ------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "0",
        "0:0",
        "18446744073709551615",
        "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
        "GPU-4CF8DB2D-06C0-7D70-1A51-E59B25B2C16C",
        "GPU-4cf8db2d06c07d701a51e59b25b2c16c",
        "GPU-urn:uuid:4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
        "GPU-{4cf8db2d-06c0-7d70-1a51-e59b25b2c16c}",
        "MIG-3eb87630-93d5-b2b6-b8ff-9b359caf4ee2",
        "MIG-GPU-662077db-fa3f-0d8f-9502-21ab0ef058a2/10/0",
        "MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0/0",
    ],
)
def test_device_references_the_reference_accepts(ref: str) -> None:
    slicing = parse_config(shared("2", devices=json.dumps([ref]))).config.sharing.time_slicing
    assert slicing is not None and slicing.resources[0].devices == (ref,)


@pytest.mark.parametrize(
    "ref",
    [
        "-1",
        "+1",
        "18446744073709551616",
        "٣",  # a digit, but not an ASCII one
        "0:0:0",
        "0:",
        "invalid-UUID",
        "GPU-UUID",
        "MIG-UUID",
        "GPU-8e2f",
        "gpu-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
        "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16",
        "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16g",
        "GPU-4cf8db2d_06c0-7d70-1a51-e59b25b2c16c",
        "MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
        "MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0",
        "MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0/0/0",
        "MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/a/0",
        "MIG-MIG-3eb87630-93d5-b2b6-b8ff-9b359caf4ee2/0/0",
    ],
)
def test_device_references_the_reference_refuses(ref: str) -> None:
    error = error_of(shared("2", devices=json.dumps([ref])))
    assert error.path == "sharing.timeSlicing.resources[0].devices[0]"
    assert "must be a GPU index (0), a MIG index (0:1), GPU-<uuid>, MIG-<uuid> or " in (
        error.message
    )


@pytest.mark.parametrize(
    ("devices", "fragment"),
    [
        pytest.param("-2", "a count of devices must be > 0, got -2", id="negative"),
        pytest.param("2.0", "got 2.0", id="float"),
        pytest.param("[2.0]", "got 2.0", id="float-in-list"),
        pytest.param("not-all", "got 'not-all'", id="not-all"),
    ],
)
def test_devices_values_the_reference_refuses(devices: str, fragment: str) -> None:
    error = error_of(shared("2", devices=devices))
    assert error.path.startswith("sharing.timeSlicing.resources[0].devices")
    assert fragment in error.message


@pytest.mark.parametrize("ids", ["[]", "[0]"])
def test_imex_channel_ids_the_reference_accepts(ids: str) -> None:
    parsed = parse_config(f"imex: {{channelIDs: {ids}, required: true}}")
    assert parsed.warnings == (
        "imex (channelIDs, required): not used by this plugin (IMEX channels are not "
        "supported); ignored",
    )


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        pytest.param("imex: {channelIDs: [1]}", "imex.channelIDs", "must be [] or [0]", id="one"),
        pytest.param("imex: {channelIDs: [0, 0]}", "imex.channelIDs", "got [0, 0]", id="twice"),
        pytest.param("imex: {channelIDs: 0}", "imex.channelIDs", "must be a list", id="scalar"),
        pytest.param("imex: {required: 'yes'}", "imex.required", "true or false", id="required"),
        pytest.param(
            "flags: {deviceDiscoveryStrategy: gpu}",
            "flags.deviceDiscoveryStrategy",
            "must be one of auto, nvml, tegra, got 'gpu'",
            id="discovery-strategy",
        ),
        pytest.param(
            "flags: {migStrategy: mixed, mpsRoot: /run/nvidia/mps}\n"
            "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}",
            "sharing.mps",
            "MPS sharing cannot be used with migStrategy mixed",
            id="mps-mixed",
        ),
        pytest.param(
            "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}",
            "flags.mpsRoot",
            "sharing.mps needs the MPS daemon's root directory here",
            id="mps-without-root",
        ),
    ],
)
def test_start_up_refusals_of_the_reference(text: str, path: str, fragment: str) -> None:
    error = error_of(text)
    assert error.path == path
    assert fragment in error.message


def test_summary_shows_a_device_count() -> None:
    text = shared("2", devices="3", rename="gpu.shared")
    assert "nvidia.com/gpu[first 3] x2 as nvidia.com/gpu.shared" in summary(
        parse_config(text).config
    )


# --- summary -------------------------------------------------------------------------------------


def test_summary_lists_non_default_id_strategy_and_renames() -> None:
    config = parse_config(
        "flags: {plugin: {deviceIDStrategy: index, deviceListStrategy: [envvar, volume-mounts]}}\n"
        "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 3}]}}"
    ).config
    assert summary(config) == (
        "valid v1 config: migStrategy=none, deviceListStrategy=envvar,volume-mounts, "
        "deviceIDStrategy=index, time-slicing nvidia.com/gpu x3 as nvidia.com/gpu.shared"
    )


# --- properties ----------------------------------------------------------------------------------


@given(st.integers(min_value=2, max_value=MAX_REPLICAS))
def test_any_replicas_in_range_round_trips(replicas: int) -> None:
    slicing = parse_config(shared(str(replicas))).config.sharing.time_slicing
    assert slicing is not None
    assert slicing.resources[0].replicas == replicas


@given(st.integers(max_value=1) | st.integers(min_value=MAX_REPLICAS + 1))
def test_any_replicas_out_of_range_fails_at_its_path(replicas: int) -> None:
    error = error_of(shared(str(replicas)))
    assert error.path == "sharing.timeSlicing.resources[0].replicas"
    assert f"got {replicas}" in error.message


@given(
    st.lists(
        st.integers(min_value=0, max_value=15).map(str)
        | st.tuples(st.integers(0, 15), st.integers(0, 15)).map(lambda p: f"{p[0]}:{p[1]}"),
        min_size=1,
        max_size=8,
    )
)
def test_any_device_index_list_is_kept_in_order_once(devices: list[str]) -> None:
    text = shared("2", devices=json.dumps(devices))
    slicing = parse_config(text).config.sharing.time_slicing
    assert slicing is not None
    assert slicing.resources[0].devices == tuple(dict.fromkeys(devices))


@given(st.sampled_from(["none", "single", "mixed"]), st.sampled_from(["none", "single", "mixed"]))
def test_flag_always_beats_env(flag: str, variable: str) -> None:
    config = load_config(None, {"mig_strategy": flag}, {"MIG_STRATEGY": variable}).config
    assert config.flags.mig_strategy == flag
