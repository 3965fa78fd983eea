"""`dra explain` on input the API server would refuse, or that the CEL library gives up on:
a selector past the library's evaluation budget, in a class or in a claim, and opaque
parameters over 10 KiB (also through YAML aliases). Each is exit 2 naming the field, through
the command's entry, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.__main__ import main

NODE = "a100-80gb-x8-mixed"
DIGITS = "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"
# 10^6 iterations: past the library's budget as past Kubernetes' cost limit
EXPENSIVE = f"{DIGITS}.all(a, {DIGITS}.all(b, {DIGITS}.all(c, {DIGITS}.all(d, "
EXPENSIVE += f"{DIGITS}.all(e, {DIGITS}.all(f, true))))))"
PARAMETERS_LIMIT = 10 * 1024


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_claim(request: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}], **devices}},
    }


def explain(capsys: pytest.CaptureFixture[str], classes: Path, *args: str) -> tuple[int, str]:
    code = main(["dra", "explain", "--simulate", NODE, "--class", str(classes), *args])
    return code, capsys.readouterr().err


def test_a_class_selector_past_the_cel_budget_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    classes = tmp_path / "classes.yaml"
    document = [device_class("ok", "true"), device_class("gpu", EXPENSIVE)]
    classes.write_text(yaml.safe_dump_all(document))
    code, err = explain(capsys, classes)
    assert code == 2
    assert f"{classes}, DeviceClass gpu: spec.selectors[0].cel.expression:" in err
    assert "budget" in err and "Traceback" not in err


def test_a_claim_selector_past_the_cel_budget_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    classes = tmp_path / "classes.yaml"
    classes.write_text(yaml.safe_dump(device_class("gpu", "true")))
    claims = tmp_path / "claim.yaml"
    request = {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": EXPENSIVE}}]}
    claims.write_text(yaml.safe_dump(resource_claim(request)))
    code, err = explain(capsys, classes, "--claim", str(claims))
    assert code == 2
    where = "ResourceClaim c: spec.devices.requests[0].exactly.selectors[0].cel.expression:"
    assert f"{claims}, {where}" in err and "budget" in err


def _with_parameters(parameters: object) -> dict[str, Any]:
    config = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}]
    return resource_claim({"deviceClassName": "gpu"}, config=config)


@pytest.mark.parametrize(("size", "code"), [(PARAMETERS_LIMIT, 0), (PARAMETERS_LIMIT + 1, 2)])
def test_opaque_parameters_are_limited_to_10_kib_of_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: int, code: int
) -> None:
    classes = tmp_path / "classes.yaml"
    classes.write_text(yaml.safe_dump(device_class("gpu", "true")))
    claims = tmp_path / "claim.yaml"
    padding = "x" * (size - len('{"kind":"GpuConfig","pad":""}'))
    claims.write_text(yaml.safe_dump(_with_parameters({"kind": "GpuConfig", "pad": padding})))
    exit_code, err = explain(capsys, classes, "--claim", str(claims))
    assert exit_code == code, err
    if code:
        assert "spec.devices.config[0].opaque.parameters: must have at most 10240 bytes" in err


def test_opaque_parameters_blown_up_by_yaml_aliases_are_refused_without_expanding_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    classes = tmp_path / "classes.yaml"
    classes.write_text(yaml.safe_dump(device_class("gpu", "true")))
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 9)]
    bomb = "{" + ", ".join(levels) + "}"  # 10^9 strings once expanded
    claims = tmp_path / "claim.yaml"
    text = yaml.safe_dump(_with_parameters({"kind": "GpuConfig"}))
    claims.write_text(text.replace("kind: GpuConfig", f"bomb: {bomb}"))
    code, err = explain(capsys, classes, "--claim", str(claims))
    assert code == 2
    assert "opaque.parameters: must have at most 10240 bytes" in err
