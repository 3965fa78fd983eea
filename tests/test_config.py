"""The v1 config: example files, values, error paths, warnings, and flag > env > file > default."""

from __future__ import annotations

import json
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
    load_config,
    parse_config,
    summary,
)
from deviceplugin.model.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
EXAMPLES = sorted(CONFIG_DIR.glob("*.yaml"))


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


def test_empty_document_is_all_defaults() -> None:
    for text in ("", "\n", "# only a comment\n", "---\n", "{}", "null"):
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
            shared("2", devices="[0, '1', 1, 2:0, 1:0, GPU-8e2f, MIG-0f1d]"),
            "sharing.time_slicing.resources.0.devices",
            ("0", "1", "2:0", "1:0", "GPU-8e2f", "MIG-0f1d"),
            id="devices-mixed-list",
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
    with pytest.raises(ValueError):
        config.version = "v1"


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
            shared("2", devices="2"),
            "sharing.timeSlicing.resources[0].devices",
            "a device count (2) is not supported",
            id="devices-count",
        ),
        pytest.param(
            shared("2", devices="some"),
            "sharing.timeSlicing.resources[0].devices",
            "must be 'all' or a list",
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
        # sharing.mps is checked like timeSlicing even though it is not applied
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
    error = error_of(
        "flags: {migStrategy: foo, failOnInitError: 'yes'}\n"
        + shared("1")
    )
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
            "flags: {mpsRoot: /run/nvidia/mps}",
            ["flags.mpsRoot: not used by this plugin (MPS is not supported); ignored"],
            id="mps-root",
        ),
        pytest.param(
            "flags: {gdrcopyEnabled: true, gdsEnabled: false, mofedEnabled: true, "
            "useNodeFeatureAPI: true, deviceDiscoveryStrategy: auto}",
            [
                "flags.gdrcopyEnabled: not used by this plugin (GDRCopy is not injected); ignored",
                "flags.gdsEnabled: not used by this plugin (GPUDirect Storage is not injected); "
                "ignored",
                "flags.mofedEnabled: not used by this plugin (MOFED is not injected); ignored",
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
        pytest.param(
            "sharing: {mps: {resources: [{name: gpu, replicas: 4}, {name: mig-1g.10gb, "
            "replicas: 2}]}}",
            [
                "sharing.mps: MPS sharing is not supported and is NOT applied: nvidia.com/gpu x4, "
                "nvidia.com/mig-1g.10gb x2 will not be shared through MPS"
            ],
            id="mps",
        ),
        pytest.param("imex: {}\nflags: {gfd: null, mpsRoot: null}", [], id="empty-or-null"),
    ],
)
def test_known_but_unused_keys_warn(text: str, warnings: list[str]) -> None:
    parsed = parse_config(text)
    assert list(parsed.warnings) == warnings
    assert parsed.config.sharing.time_slicing is None


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
    assert [w.split(":")[0].split(" ")[0] for w in parsed.warnings] == [
        "flags.mpsRoot",
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
        "cdi_annotation_prefix": "CDI_ANNOTATION_PREFIX",
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
    path.write_text("flags: {mpsRoot: /run/nvidia/mps}\n")
    parsed = load_config(str(path), {"mig_strategy": "mixed"}, {})
    assert parsed.config.flags.mig_strategy == "mixed"
    assert parsed.warnings == (
        "flags.mpsRoot: not used by this plugin (MPS is not supported); ignored",
    )


def test_override_into_a_section_of_the_wrong_type_reports_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags: {plugin: 5}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path), {"pass_device_specs": "true"}, {})
    assert caught.value.path == "flags.plugin"


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
