"""dra.resourceapi and `dra explain`'s readers: claims and classes are checked as the API server
checks them, in every served version, and bad input of any kind is answered with exit 2 and
the field path, never a traceback. Random bytes and random YAML trees get an error or a result,
never another exception."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.__main__ import main
from deviceplugin.explain.claims import Candidate, allocate_all
from deviceplugin.explain.command import parse_documents
from deviceplugin.explain.resourceapi import (
    VERSIONS,
    is_extended_resource_name,
    read_claims,
    read_classes,
)
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.slices import build_devices
from tests.dranode import inventory

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests" / "dra"
CLASSES = MANIFESTS / "deviceclasses.yaml"
CLASS_DOCUMENTS = list(yaml.safe_load_all(CLASSES.read_text()))
DEVICES = [Candidate.of("gpu.nvidia.com", d) for d in build_devices(inventory("a30-x4-mig"))]


def claim(spec: Any, version: str = "v1", kind: str = "ResourceClaim") -> dict[str, Any]:
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": kind,
        "metadata": {"name": "c"},
        "spec": spec,
    }


def requests(*entries: Any) -> dict[str, Any]:
    return {"devices": {"requests": list(entries)}}


def mig(**fields: Any) -> dict[str, Any]:
    return {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", **fields}}


def explain_claim(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: Any
) -> tuple[int, str, str]:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(document))
    code = main(
        [
            "dra",
            "explain",
            "--class",
            str(CLASSES),
            "--claim",
            str(path),
            "--simulate",
            "a30-x4-mig",
        ]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        (
            {"devices": {"requests": "hello"}},
            "spec.devices.requests",
            "must be a list, got 'hello'",
        ),
        (requests(None), "spec.devices.requests[0].name", "required"),
        (
            requests({"exactly": {"deviceClassName": "mig.nvidia.com"}}),
            "spec.devices.requests[0].name",
            "required",
        ),
        ([1], "spec", "must be a mapping, got a list"),
        (requests(mig(count=-3)), "spec.devices.requests[0].exactly.count", "greater than zero"),
        (
            requests(mig(count="2")),
            "spec.devices.requests[0].exactly.count",
            "must be an integer, got '2' (a quoted string)",
        ),
        (
            requests(mig(), mig()),
            "spec.devices.requests[1].name",
            "duplicate request name 'mig'",
        ),
    ],
)
def test_the_malformed_claims_of_the_hardening_issue_are_refused_with_their_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, spec: Any, path: str, message: str
) -> None:
    code, out, err = explain_claim(capsys, tmp_path, claim(spec))
    assert code == 2, out  # 1 would be an internal error, with a traceback
    assert f"(ResourceClaim c): {path}: " in err
    assert message in err
    assert "would be allocated" not in out and "Traceback" not in err


def test_count_zero_is_defaulted_to_one_as_the_api_server_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Count 0 is Go's zero value, which SetDefaults_ExactDeviceRequest turns into 1: the API
    server takes the claim and allocates one device. The report says so."""
    code, out, _ = explain_claim(capsys, tmp_path, claim(requests(mig(count=0))))
    assert code == 0
    assert "would be allocated\n  mig: gpu-0-mig-3-0\n" in out
    assert "note: spec.devices.requests[0].exactly.count: 0 is the same as unset" in out


@pytest.mark.parametrize(
    ("document", "path", "message"),
    [
        (
            claim(requests({"name": "mig", "deviceClassName": "mig.nvidia.com", "count": 1})),
            "spec.devices.requests[0].deviceClassName",
            "unknown field (inline request fields are the resource.k8s.io/v1beta1 shape",
        ),
        (
            claim(requests({"name": "mig", "exactly": {"deviceClassName": "x"}}), "v1beta1"),
            "spec.devices.requests[0].exactly",
            "unknown field (resource.k8s.io/v1beta1 has the request's fields inline)",
        ),
        (claim(requests({"name": "mig"})), "spec.devices.requests[0]", "exactly one of"),
        (
            claim(requests({"name": "mig", "firstAvailable": []}), "v1beta1"),
            "spec.devices.requests[0]",
            "`deviceClassName` or `firstAvailable` is required",
        ),
        (
            claim(requests({**mig(), "firstAvailable": [{"name": "a", "deviceClassName": "x"}]})),
            "spec.devices.requests[0]",
            "not both",
        ),
        (
            claim(requests({"name": "Mig_1", "exactly": {"deviceClassName": "x"}})),
            "spec.devices.requests[0].name",
            "must be a DNS label",
        ),
        (claim(requests(mig(deviceClassName=""))), "exactly.deviceClassName", "required"),
        (
            claim(requests(mig(allocationMode="All", count=2))),
            "spec.devices.requests[0].exactly.count",
            "must not be specified when allocationMode is 'All'",
        ),
        (
            claim(requests(mig(allocationMode="Some"))),
            "spec.devices.requests[0].exactly.allocationMode",
            "must be ExactCount or All",
        ),
        (
            claim(requests(mig(adminAccess="yes"))),
            "spec.devices.requests[0].exactly.adminAccess",
            "must be true or false",
        ),
        (
            claim(requests(mig(selectors=[{"cel": {"expression": "device.("}}]))),
            "spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "does not compile",
        ),
        (
            claim(requests(mig(selectors=[{"cel": {"expression": "true"}}] * 33))),
            "spec.devices.requests[0].exactly.selectors",
            "must have at most 32 items, has 33",
        ),
        (
            claim(requests(mig(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]))),
            "spec.devices.requests[0].exactly.tolerations[0].value",
            "must be empty for operator `Exists`",
        ),
        (
            claim(requests(mig(tolerations=[{"operator": "Within"}]))),
            "spec.devices.requests[0].exactly.tolerations[0].operator",
            "must be Exists or Equal",
        ),
        (
            claim(requests(mig(tolerations=[{"effect": "PreferNoSchedule"}]))),
            "spec.devices.requests[0].exactly.tolerations[0].effect",
            "must be one of None, NoSchedule, NoExecute",
        ),
        (
            claim({"devices": {"requests": [mig()], "constraints": [{"requests": ["gpu"]}]}}),
            "spec.devices.constraints[0].requests[0]",
            "'gpu' is not a request of this claim",
        ),
        (
            claim({"devices": {"requests": [mig()], "constraints": [{"requests": ["mig"]}]}}),
            "spec.devices.constraints[0]",
            "exactly one of `matchAttribute` or `distinctAttribute`",
        ),
        (
            claim({"devices": {"requests": [mig()], "constraints": [{"matchAttribute": "uuid"}]}}),
            "spec.devices.constraints[0].matchAttribute",
            "must be a domain and an attribute name",
        ),
        (
            claim({"devices": {"requests": [mig()], "config": [{"requests": ["mig"]}]}}),
            "spec.devices.config[0].opaque",
            "required",
        ),
        (
            claim(
                requests(
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "a", "deviceClassName": "x"},
                            {"name": "a", "deviceClassName": "y"},
                        ],
                    }
                )
            ),
            "spec.devices.requests[0].firstAvailable[1].name",
            "duplicate subrequest name 'a'",
        ),
        (
            claim({"spec": requests(mig(count=-1))}, kind="ResourceClaimTemplate"),
            "spec.spec.devices.requests[0].exactly.count",
            "greater than zero",
        ),
        (
            claim(requests(mig()), kind="ResourceClaimTemplate"),
            "spec.devices",
            "unknown field",
        ),
        (
            claim(requests(mig()), "v1alpha3"),
            "apiVersion",
            "must be one of resource.k8s.io/v1, resource.k8s.io/v1beta2, resource.k8s.io/v1beta1",
        ),
        ({**claim(requests(mig())), "metadata": {}}, "metadata.name", "required"),
    ],
)
def test_claims_are_checked_as_the_api_server_checks_them(
    document: dict[str, Any], path: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        read_claims([document], "claim.yaml")
    assert path in refused.value.path
    assert message in refused.value.message


def test_every_problem_of_a_claim_is_listed() -> None:
    bad = claim(requests(mig(count=-1), {"name": "mig", "exactly": {"count": "x"}}))
    with pytest.raises(ConfigError) as refused:
        read_claims([bad], "claim.yaml")
    assert refused.value.path == (
        "claim.yaml, document 1 (ResourceClaim c): spec.devices.requests[0].exactly.count"
    )
    text = str(refused.value)
    assert "and 3 more" in text
    assert "spec.devices.requests[1].name: duplicate request name 'mig'" in text
    assert "spec.devices.requests[1].exactly.deviceClassName: required" in text


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({**CLASS_DOCUMENTS[0], "spec": {"extendedResourceName": "gpu"}}, "extended resource"),
        ({**CLASS_DOCUMENTS[0], "spec": {"selectors": [{"cel": {}}]}}, "required"),
        ({**CLASS_DOCUMENTS[0], "spec": {"selector": []}}, "unknown field"),
        ({**CLASS_DOCUMENTS[0], "metadata": {"name": "Not_A_Name"}}, "DNS subdomain"),
    ],
)
def test_device_classes_are_checked_too(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_classes([document], "classes.yaml")
    with pytest.raises(ConfigError, match="defined twice"):
        read_classes([CLASS_DOCUMENTS[0], CLASS_DOCUMENTS[0]], "classes.yaml")
    with pytest.raises(ConfigError, match="holds no DeviceClass"):
        read_classes([claim(requests(mig()))], "classes.yaml")


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("Nvidia.com/gpu", False),
        ("a/b/c", False),
        ("nvidia.com/", False),
    ],
)
def test_extended_resource_names(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00binary", "not YAML"),
        (b"key: [unclosed", "not YAML"),
        (b"", "holds no document"),
        (b"---\n...\n", "holds no document"),
        (b"42\n", "must be a Kubernetes object (a mapping), got 42"),
        (b"- a\n- b\n", "must be a Kubernetes object (a mapping), got a list"),
        (b"when: 2001-13-45\n", "not YAML"),
    ],
)
def test_unreadable_claim_files_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "claim.yaml"
    path.write_bytes(content)
    args = ["dra", "explain", "--class", str(CLASSES), "--simulate", "a30-x4-mig"]
    assert main([*args, "--claim", str(path)]) == 2
    assert message in capsys.readouterr().err
    assert main([*args, "--claim", str(tmp_path)]) == 2  # a directory
    assert main([*args, "--claim", str(tmp_path / "missing.yaml")]) == 2
    assert "No such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "line",
    ['{"uuid": "GPU-1", "xid": "79"}', '{"uuid": 7, "xid": 79}', "[1]", "not json", '{"xid": 79}'],
)
def test_a_malformed_events_line_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str
) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(line + "\n")
    args = ["dra", "explain", "--class", str(CLASSES), "--simulate", "a30-x4-mig"]
    assert main([*args, "--simulate-events", str(events)]) == 2
    assert f"{events}:1: not an event" in capsys.readouterr().err


def test_bad_usage_of_explain_is_a_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["dra", "explain", "--class", str(CLASSES)]
    assert main([*args, "--simulate", "no-such-preset"]) == 2
    assert "no-such-preset" in capsys.readouterr().err
    node = tmp_path / "node.yaml"
    node.write_text("[1]\n")
    assert main([*args, "--simulate", str(node)]) == 2
    assert f"--simulate {node}: " in capsys.readouterr().err
    assert main(args) == 2
    assert "needs --simulate" in capsys.readouterr().err
    bad_config = tmp_path / "config.yaml"
    bad_config.write_text("version: v1\nflags: {migStrategy: diagonal}\n")
    assert main([*args, "--simulate", "a30-x4-mig", "--config-file", str(bad_config)]) == 2
    assert "flags.migStrategy" in capsys.readouterr().err


# --- property-based -----------------------------------------------------------------------------

FIELDS = [
    "apiVersion", "kind", "metadata", "name", "spec", "devices", "requests", "exactly",
    "firstAvailable", "deviceClassName", "selectors", "cel", "expression", "allocationMode",
    "count", "adminAccess", "tolerations", "key", "operator", "value", "effect", "constraints",
    "matchAttribute", "distinctAttribute", "config", "opaque", "driver", "parameters",
    "capacity", "derivedAttributes", "extendedResourceName",
]  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.sampled_from(
        [
            "mig",
            "gpu.nvidia.com",
            "mig.nvidia.com",
            "All",
            "ExactCount",
            "Exists",
            "NoSchedule",
            "nvidia.com/parentUUID",
            "true",
            "device.attributes['nvidia.com'].healthy",
            "device.(",
            "",
        ]
    ),
    st.text(max_size=12),
)
TREES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(FIELDS), st.text(max_size=6), st.integers()),
            children,
            max_size=5,
        ),
    ),
    max_leaves=40,
)
OBJECTS = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from([*(f"resource.k8s.io/{v}" for v in VERSIONS), "v1", 3]),
        "kind": st.sampled_from(["ResourceClaim", "ResourceClaimTemplate", "DeviceClass"]),
        "metadata": st.one_of(st.just({"name": "x"}), TREES),
        "spec": TREES,
    }
)


def _read_everything(documents: list[object]) -> None:
    """Read the documents as classes and as claims, and allocate what reads as claims: each
    step may refuse with ConfigError, nothing else may escape."""
    classes = read_classes(CLASS_DOCUMENTS, "classes")
    with contextlib.suppress(ConfigError):
        classes.update(read_classes(documents, "random"))
    try:
        claims = read_claims(documents, "random")
    except ConfigError:
        return
    for allocation in allocate_all(claims, classes, DEVICES):
        assert allocation.failure or allocation.devices is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_are_an_error_or_a_result(data: bytes) -> None:
    try:
        documents = parse_documents(data, "random")
    except ConfigError:
        return
    _read_everything(documents)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(OBJECTS, TREES), min_size=1, max_size=3))
def test_random_yaml_trees_are_an_error_or_a_result(documents: list[Any]) -> None:
    text = yaml.safe_dump_all(documents).encode()
    try:
        parsed = parse_documents(text, "random")
    except ConfigError:
        return
    _read_everything(parsed)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(FIELDS), TREES)
def test_one_field_of_a_valid_claim_replaced_is_an_error_or_a_result(
    field: str, value: Any
) -> None:
    """The seed's pair claim with one field anywhere replaced by a random tree."""
    pair = yaml.safe_load((MANIFESTS / "resourceclaim-mig-pair.yaml").read_text())
    spots = [pair, pair["spec"], pair["spec"]["devices"], pair["spec"]["devices"]["requests"][0]]
    spots.append(pair["spec"]["devices"]["requests"][0]["exactly"])
    spots.append(pair["spec"]["devices"]["constraints"][0])
    for spot in spots:
        changed = json.loads(json.dumps(pair))
        target = changed
        for step in _path_to(pair, spot):
            target = target[step]
        target[field] = value
        _read_everything([changed])


def _path_to(root: Any, wanted: Any) -> list[Any]:
    """The keys and indices from `root` down to the object `wanted` (by identity)."""
    if root is wanted:
        return []
    items = (
        root.items()
        if isinstance(root, dict)
        else enumerate(root)
        if isinstance(root, list)
        else []
    )
    for key, child in items:
        if isinstance(child, dict | list):
            try:
                return [key, *_path_to(child, wanted)]
            except LookupError:
                continue
    raise LookupError
