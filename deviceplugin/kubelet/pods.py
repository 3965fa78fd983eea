"""Which pod holds which device: a client of the kubelet's PodResources v1 API.

The kubelet serves `List` on `/var/lib/kubelet/pod-resources/kubelet.sock` and reports, per pod
and container, the device IDs its device manager handed out: the IDs this plugin advertised, so
a replica `<uuid>::<n>` or a MIG UUID leads straight back to the hardware. The socket is
optional (the DaemonSet must mount the directory): an absent socket means "assignments
unknown", never a failure of the plugin.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from deviceplugin.kubelet.registration import pod_resources_socket as pod_resources_socket
from deviceplugin.model.assignments import ClaimDevice, PodDevice, PodDevices, PodResources
from deviceplugin.model.errors import PodResourcesError
from deviceplugin.wire.podresources.v1 import api_pb2, api_pb2_grpc

LIST_TIMEOUT_SECONDS = 2.0


def claim_devices(response: api_pb2.ListPodResourcesResponse) -> tuple[ClaimDevice, ...]:
    """One entry per (container, claim, device) of the claims the kubelet prepared."""
    return tuple(
        ClaimDevice(
            pod.namespace,
            pod.name,
            container.name,
            f"{claim.claim_namespace}/{claim.claim_name}",
            device.driver_name,
            device.pool_name,
            device.device_name,
        )
        for pod in response.pod_resources
        for container in pod.containers
        for claim in container.dynamic_resources
        for device in claim.claim_resources
    )


def pod_devices(response: api_pb2.ListPodResourcesResponse) -> PodDevices:
    """Flatten a List answer into one entry per (container, resource, device ID)."""
    return PodDevices(
        PodDevice(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
    )


async def list_pod_resources(
    socket: Path, timeout: float = LIST_TIMEOUT_SECONDS
) -> PodResources | None:
    """Ask the kubelet which containers hold which device-plugin IDs and claims' devices; None
    when the socket is absent. Raises PodResourcesError when the socket is there but List does
    not answer within `timeout`."""
    if not socket.exists():
        return None
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            response = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise PodResourcesError(
            f"pod-resources List on {socket} failed: {exc.code().name}: {exc.details()}"
        ) from None
    return PodResources(pod_devices(response), claim_devices(response))


async def list_pod_devices(
    socket: Path, timeout: float = LIST_TIMEOUT_SECONDS
) -> PodDevices | None:
    """The device-plugin IDs of `list_pod_resources`."""
    found = await list_pod_resources(socket, timeout)
    return None if found is None else found.devices


async def read_pods(socket: Path) -> tuple[PodDevices | None, str]:
    """(assignments, "") or (None, why they are unknown): for callers that show a note
    instead of failing."""
    try:
        pods = await list_pod_devices(socket)
    except PodResourcesError as exc:
        return None, str(exc)
    if pods is None:
        return None, f"pod-resources socket {socket} not found: pod assignments unknown"
    return pods, ""
