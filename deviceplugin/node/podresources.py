"""The kubelet's PodResources v1 API, read: which container holds which device.

The kubelet serves `List` on `/var/lib/kubelet/pod-resources/kubelet.sock` and reports, per pod
and container, the device IDs device plugins handed out (`devices`) and the devices of the
claims it prepared (`dynamic_resources`). Both daemons read it: the device plugin for its
pods' view and what DRA claims hold, the DRA driver for what a device plugin's pods hold.
"""

from __future__ import annotations

from pathlib import Path

import grpc

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
