"""Property: whatever a claim's allocation carries as config, this driver's reader gives entries
or an OpaqueConfigError naming a field, never another exception; and so do the settings a
device takes from them and, with MPS, the container's edits. Trees of JSON values whose keys
are mostly the API's own, so the values reach the models: quantities with huge exponents,
integers of thousands of digits, more entries than Kubernetes keeps, deep nesting. The work is
bounded by the reader's own limits (`opaquebounds`), not by a timer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deviceplugin.dra.mpsclient import DaemonHome, client_edits
from deviceplugin.dra.opaque import API_VERSIONS, KINDS, SOURCES, read_entries, settings_for
from deviceplugin.dra.opaquebounds import MAX_ENTRIES, MAX_PARAMETERS
from deviceplugin.dra.opaquetypes import STRATEGIES, OpaqueConfigError

DRIVER = "gpu.nvidia.com"
UUID = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOME = DaemonHome.under(Path("/run/mps"), "gpu-0")
LONGEST_MESSAGE = 8 * MAX_PARAMETERS  # a quoted value is at most the parameters' size, escaped

KEYS = [
    "apiVersion",
    "kind",
    "sharing",
    "strategy",
    "timeSlicingConfig",
    "interval",
    "mpsConfig",
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
    "0",
    UUID,
]
quantities = (
    st.builds(
        lambda number, exponent: f"{number}e{exponent}",
        st.sampled_from(["1", "9", "0", "-1", ".5", "1."]),
        st.sampled_from([18, 19, 999999, 10**12, -999999]) | st.integers(-(10**12), 10**12),
    )
    | st.builds(
        lambda number, suffix: f"{number}{suffix}",
        st.integers(-(10**25), 10**25) | st.decimals(allow_nan=False, allow_infinity=False),
        st.sampled_from(
            ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "E"]
        ),
    )
    | st.sampled_from(["1e999999", "1e999999999999", "8Ei", "9223372036854775808", "1" * 70])
)
huge = st.integers(min_value=10**18, max_value=10**30) | st.sampled_from(
    [2**63, -(2**63), 10**4000, -(10**4200)]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | huge
    | st.floats()
    | quantities
    | st.sampled_from([*API_VERSIONS, *KINDS, *STRATEGIES, "Default", "Short", "x" * 12000])
    | st.text(max_size=20)
)
keys = st.sampled_from(KEYS) | st.text(max_size=8)
trees = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
    max_leaves=30,
)
deep = st.builds(
    lambda depth, leaf: _nested(depth, leaf), st.integers(min_value=10, max_value=60), scalars
)
mps_config = st.fixed_dictionaries(
    {},
    optional={
        "defaultActiveThreadPercentage": st.integers(0, 101) | scalars,
        "defaultPinnedDeviceMemoryLimit": quantities | huge,
        "defaultPerDevicePinnedMemoryLimit": st.dictionaries(
            st.sampled_from(["0", UUID]) | st.text(max_size=8), quantities | huge, max_size=40
        )
        | trees,
    },
)
sharing = st.fixed_dictionaries(
    {"strategy": st.sampled_from(STRATEGIES)},
    optional={
        "mpsConfig": mps_config,
        "timeSlicingConfig": st.fixed_dictionaries({"interval": scalars}),
    },
)
parameters = (
    st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(API_VERSIONS),
            "kind": st.sampled_from(KINDS),
            "sharing": sharing | trees | deep,
        }
    )
    | trees
)
requests = st.none() | st.lists(st.sampled_from(["gpu", "gpu/a", "r" * 200]) | scalars, max_size=40)
entries = (
    st.fixed_dictionaries(
        {"opaque": st.fixed_dictionaries({"driver": st.just(DRIVER), "parameters": parameters})},
        optional={"source": st.sampled_from(SOURCES) | scalars, "requests": requests},
    )
    | trees
)
configs = st.lists(entries, max_size=4) | st.builds(
    lambda entry, count: [entry] * count,
    entries,
    st.integers(min_value=MAX_ENTRIES - 2, max_value=MAX_ENTRIES + 2),
)


def _nested(depth: int, leaf: object) -> object:
    for _ in range(depth):
        leaf = {"mpsConfig": leaf}
    return leaf


def _mps(limit: object) -> list[Any]:
    sharing = {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit}}
    parameters = {"apiVersion": API_VERSIONS[0], "kind": "GpuConfig", "sharing": sharing}
    return [{"opaque": {"driver": DRIVER, "parameters": parameters}}]


@FUZZ
@given(configs, st.sampled_from(["gpu", "gpu/a", "other"]), st.booleans())
@example(_mps("1e999999999999"), "gpu", False)  # decimal.Overflow, once
@example(_mps(10**5000), "gpu", False)  # too long for Python to write as text
def test_any_config_gives_entries_or_an_opaque_config_error(
    config: list[Any], request: str, is_mig: bool
) -> None:
    try:
        found = read_entries({"config": config}, DRIVER)
        chosen = settings_for(found, request, "gpu-0", is_mig)
        if chosen.mps is not None:
            client_edits(chosen.mps, UUID, 40 << 30, "the memory of gpu-0", HOME)
    except OpaqueConfigError as error:
        assert error.path.startswith("status.allocation.devices.config"), error.path
        assert len(str(error)) < LONGEST_MESSAGE, str(error)[:500]


@FUZZ
@given(trees)
@example(True)  # not iterable, once
def test_any_allocation_gives_entries_or_an_opaque_config_error(devices: object) -> None:
    try:
        read_entries({"config": devices}, DRIVER)
    except OpaqueConfigError as error:
        assert error.path.startswith("status.allocation.devices.config"), error.path
