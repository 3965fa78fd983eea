"""Property: whatever a config file holds, loading it gives a config or a ConfigError with a
short message, never another exception. Random bytes, random text, and random YAML and JSON
trees whose keys are mostly the schema's own, so the values reach the typed models."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.model.config import ParsedConfig, parse_config
from deviceplugin.model.config_keys import SCHEMA, Shape
from deviceplugin.model.errors import ConfigError
from deviceplugin.node.configread import load_config

LONGEST_MESSAGE = 3000  # every quoted input is cut to a few hundred characters
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def schema_keys(shape: Shape) -> set[str]:
    """Every key the schema names, at any depth."""
    if isinstance(shape, Mapping):
        return set(shape) | {key for child in shape.values() for key in schema_keys(child)}
    if isinstance(shape, list):
        return schema_keys(shape[0])
    return set()


KEYS = sorted(schema_keys(SCHEMA))
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**320)
    | st.floats()
    | st.sampled_from(["all", "v1", "mixed", "none", "gpu", "0", "1:0", "", "*", "true"])
    | st.sampled_from(["GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c", "nvidia.com/gpu", "x" * 5000])
    | st.text(max_size=20)
)
keys = st.sampled_from(KEYS) | st.text(max_size=12)
trees = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
    max_leaves=30,
)
documents = st.dictionaries(keys, trees, max_size=6)


def loads_or_refuses(text: str) -> None:
    """The property itself, on the text a file would hold."""
    try:
        result = parse_config(text)
    except ConfigError as error:
        assert len(str(error)) < LONGEST_MESSAGE, str(error)[:500]
    else:
        assert isinstance(result, ParsedConfig)


@FUZZ
@given(documents)
def test_any_yaml_tree(document: dict[str, object]) -> None:
    loads_or_refuses(yaml.safe_dump(document, allow_unicode=True))


@FUZZ
@given(documents)
def test_any_json_tree(document: dict[str, object]) -> None:
    has_nan = any(isinstance(v, float) and not math.isfinite(v) for v in _leaves(document))
    loads_or_refuses(json.dumps(document, allow_nan=has_nan))


@FUZZ
@given(st.text(max_size=400))
def test_any_text(text: str) -> None:
    loads_or_refuses(text)


@FUZZ
@given(st.binary(max_size=400))
def test_any_bytes_in_a_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    try:
        load_config(str(path), {}, {})
    except ConfigError as error:
        assert len(str(error)) < LONGEST_MESSAGE


def _leaves(value: object) -> list[object]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]
