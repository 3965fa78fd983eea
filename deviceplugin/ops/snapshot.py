"""The plugin's state as one JSON document: what `/status` serves and what `inspect` prints.

Both build it from the same inputs (the resource sets with their health, the active config and,
when known, the kubelet's pod assignments), so `inspect --from` shows a live plugin exactly as
`inspect` shows a dry run; the live-only fields (registered, ready, why not ready) are null in a
dry run. Readiness is decided here once, for `/readyz` and `/status` alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deviceplugin.model.assignments import PodDevices
from deviceplugin.model.config import Config
from deviceplugin.model.devices import Device
from deviceplugin.model.resources import ResourceSet
from deviceplugin.ops.status import Status


def build_snapshot(
    resources: Mapping[str, ResourceSet],
    config: Config,
    config_source: str | None,
    *,
    status: Status | None = None,
    pods_socket: Path | None = None,
    pods: PodDevices | None = None,
    pods_note: str = "",
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The document. `status` is None for a dry run; `pods_socket` None leaves pods out."""
    reasons = status.not_ready if status is not None else None
    registered = status.registered if status is not None else None
    document: dict[str, Any] = {
        "live": status is not None,
        "ready": None if reasons is None else not reasons,
        "not_ready": reasons,
        "config": {
            **(
                status.core.config_document()
                if status is not None
                else {"source": config_source or "defaults", "last_error": None}
                | {"last_error_field": None, "selection": None}
            ),
            "active": config.dump(),
        },
        "resources": [
            _resource(resource, registered, pods if pods_socket is not None else None)
            for resource in resources.values()
        ],
        "notes": list(notes),
    }
    if status is not None and status.dra_holds is not None:
        document["dra_holds"] = dict(status.dra_holds)
    if pods_socket is not None:
        document["pods"] = {
            "socket": str(pods_socket),
            "known": pods is not None,
            "note": pods_note,
        }
    return document


def without_pods(document: dict[str, Any]) -> dict[str, Any]:
    """The document as it reads when pod assignments were not asked for."""
    stripped = {key: value for key, value in document.items() if key != "pods"}
    stripped["resources"] = [
        {
            **resource,
            "devices": [
                {key: value for key, value in device.items() if key != "pods"}
                for device in resource["devices"]
            ],
        }
        for resource in document["resources"]
    ]
    return stripped


def _resource(
    resource: ResourceSet, registered: frozenset[str] | None, pods: PodDevices | None
) -> dict[str, Any]:
    healthy = resource.healthy_count
    return {
        "name": resource.name,
        "socket": resource.socket_name,
        "replicas": resource.replicas,
        "total": len(resource.devices),
        "healthy": healthy,
        "registered": None if registered is None else resource.name in registered,
        "devices": [_device(resource, device, pods) for device in resource.devices],
    }


def _device(resource: ResourceSet, device: Device, pods: PodDevices | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": device.id,
        "health": device.health.value,
        "reason": device.reason,
        "physical_uuid": device.physical_uuid,
        "gpu_uuid": device.gpu_uuid,
        "gpu_index": device.gpu_index,
        "mig_profile": device.mig.profile if device.mig is not None else None,
        "numa_node": device.numa_node,
        "replica": device.replica,
        "replicas": resource.replicas,
    }
    if pods is not None:
        entry["pods"] = [
            {"namespace": holder.namespace, "pod": holder.pod, "container": holder.container}
            for holder in pods.holders(resource.name, device.id)
        ]
    return entry
