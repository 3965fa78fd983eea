"""The committed stubs are exactly what protoc generates from protos/, and the wire names match
the kubelet's API."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from deviceplugin.kubelet.v1beta1 import api_pb2

ROOT = Path(__file__).resolve().parent.parent


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("generate", ROOT / "protos" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    written = _generator().generate(tmp_path)
    assert written, "protoc produced nothing"
    for fresh in written:
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is not committed; run `make protos`"
        assert fresh.read_text() == committed.read_text(), (
            f"{committed} is stale; run `make protos`"
        )


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        pytest.param(
            "RegisterRequest",
            {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
            id="register",
        ),
        pytest.param(
            "DevicePluginOptions",
            {"pre_start_required": 1, "get_preferred_allocation_available": 2},
            id="options",
        ),
        pytest.param("Device", {"ID": 1, "health": 2, "topology": 3}, id="device"),
        pytest.param("NUMANode", {"ID": 1}, id="numa"),
        pytest.param(
            "ContainerPreferredAllocationRequest",
            {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
            id="preferred-request",
        ),
        pytest.param("ContainerPreferredAllocationResponse", {"deviceIDs": 1}, id="preferred"),
        pytest.param("ContainerAllocateRequest", {"devices_ids": 1}, id="allocate-request"),
        pytest.param(
            "ContainerAllocateResponse",
            {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
            id="allocate-response",
        ),
        pytest.param("CDIDevice", {"name": 1}, id="cdi"),
        pytest.param("Mount", {"container_path": 1, "host_path": 2, "read_only": 3}, id="mount"),
        pytest.param(
            "DeviceSpec", {"container_path": 1, "host_path": 2, "permissions": 3}, id="device-spec"
        ),
        pytest.param("PreStartContainerRequest", {"devices_ids": 1}, id="prestart"),
    ],
)
def test_wire_field_numbers(message: str, fields: dict[str, int]) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields


def test_services_and_package() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    services = api_pb2.DESCRIPTOR.services_by_name
    assert set(services["Registration"].methods_by_name) == {"Register"}
    plugin = services["DevicePlugin"].methods_by_name
    assert set(plugin) == {
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    }
    assert plugin["ListAndWatch"].server_streaming
    assert not any(m.client_streaming for m in plugin.values())
