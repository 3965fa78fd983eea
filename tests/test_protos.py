"""The committed stubs are exactly what protoc generates from protos/, and the wire names match
the kubelet's API."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2

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


def _dra_messages(module: object) -> dict[str, dict[str, int]]:
    messages = module.DESCRIPTOR.message_types_by_name  # type: ignore[attr-defined]
    return {name: {f.name: f.number for f in m.fields} for name, m in messages.items()}


DRA_FIELDS = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "Device": {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4},
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourcesResponse": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_wire_names(version: str) -> None:
    module = importlib.import_module(f"deviceplugin.wire.dra.{version}.api_pb2")
    package = f"k8s.io.kubelet.pkg.apis.dra.{version}"
    assert module.DESCRIPTOR.package == package
    fields = {name: dict(f) for name, f in DRA_FIELDS.items()}
    if version == "v1":
        fields["Device"]["share_id"] = 5
    messages = _dra_messages(module)
    assert {name: messages[name] for name in fields} == fields
    service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == f"{package}.DRAPlugin"
    assert set(service.methods_by_name) == {"NodePrepareResources", "NodeUnprepareResources"}
    response = module.DESCRIPTOR.message_types_by_name["NodePrepareResourcesResponse"]
    assert response.fields_by_name["claims"].message_type.GetOptions().map_entry


def test_plugin_registration_wire_names() -> None:
    from deviceplugin.wire.pluginregistration.v1 import api_pb2 as registration

    assert registration.DESCRIPTOR.package == "pluginregistration"
    assert _dra_messages(registration) == {
        "PluginInfo": {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4},
        "RegistrationStatus": {"plugin_registered": 1, "error": 2},
        "RegistrationStatusResponse": {},
        "InfoRequest": {},
    }
    service = registration.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert set(service.methods_by_name) == {"GetInfo", "NotifyRegistrationStatus"}


HEALTH_FIELDS = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": 1, "device_name": 2},
    "DeviceHealth": {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    },
    "NodeWatchResourcesResponse": {"devices": 1},
}


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_dra_health_wire_names(version: str) -> None:
    """Package `v1` / `v1alpha1` as in k8s.io/kubelet/pkg/apis/dra-health: the kubelet calls
    `/<version>.DRAResourceHealth/NodeWatchResources`."""
    module = importlib.import_module(f"deviceplugin.wire.drahealth.{version}.api_pb2")
    assert module.DESCRIPTOR.package == version
    assert _dra_messages(module) == HEALTH_FIELDS
    status = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in status.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    service = module.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert service.full_name == f"{version}.DRAResourceHealth"
    (method,) = service.methods
    assert method.name == "NodeWatchResources"
    assert method.server_streaming and not method.client_streaming
    assert method.input_type.name == "NodeWatchResourcesRequest"
    assert method.output_type.name == "NodeWatchResourcesResponse"
    fields = module.DESCRIPTOR.message_types_by_name["DeviceHealth"].fields_by_name
    assert fields["health"].enum_type.full_name == f"{version}.HealthStatus"
    assert fields["last_updated_time"].type == fields["last_updated_time"].TYPE_INT64
    assert fields["health_check_timeout_seconds"].type == fields["last_updated_time"].TYPE_INT64
