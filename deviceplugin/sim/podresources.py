"""A kubelet PodResources emulator: which container holds which device, as the kubelet reports it.

Serves `v1.PodResourcesLister/List` on `<root>/pod-resources/kubelet.sock`, where `<root>` is the
emulated kubelet root (the KubeletEmulator then lives in `<root>/device-plugins`, as on a node).
A test or the demo says who holds what, the way the kubelet records it: `assign` for the IDs
its device manager handed a container from a device plugin's Allocate (`devices`), and
`assign_claim` for a device of a ResourceClaim its DRA manager prepared for a container
(`dynamic_resources`, as with KubeletPodResourcesDynamicResources on); `release` forgets a pod
and both. The other PodResources calls answer UNIMPLEMENTED, as from a kubelet with those
features off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

import grpc

from deviceplugin.model.record import record
from deviceplugin.node.unixgrpc import close_unix, listen_unix
from deviceplugin.wire.podresources.v1 import api_pb2, api_pb2_grpc


@record
class _Container:
    """What one container holds, in the order it was assigned."""

    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> device IDs
    # (claim namespace, claim name) -> (driver, pool, device) of each of its devices
    claims: dict[tuple[str, str], list[tuple[str, str, str]]] = field(default_factory=dict)

    def message(self, name: str) -> api_pb2.ContainerResources:
        return api_pb2.ContainerResources(
            name=name,
            devices=[
                api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                for resource, ids in self.devices.items()
            ],
            dynamic_resources=[
                api_pb2.DynamicResource(
                    claim_namespace=claim_namespace,
                    claim_name=claim_name,
                    claim_resources=[
                        api_pb2.ClaimResource(
                            driver_name=driver, pool_name=pool, device_name=device
                        )
                        for driver, pool, device in devices
                    ],
                )
                for (claim_namespace, claim_name), devices in self.claims.items()
            ],
        )


# (namespace, pod) -> container name -> what it holds
_Assignments = dict[tuple[str, str], dict[str, _Container]]


class PodResourcesEmulator(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's pod-resources endpoint, in the caller's event loop."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._pods: _Assignments = {}
        self._server: grpc.aio.Server | None = None
        self.calls = 0

    @property
    def socket(self) -> Path:
        return self.root / "pod-resources" / "kubelet.sock"

    async def start(self) -> None:
        """Listen on a fresh socket (a stale one is removed, as the kubelet does)."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self._server = await listen_unix(
            self.socket,
            lambda server: api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server),
        )

    async def stop(self) -> None:
        """Stop serving; the socket goes away."""
        server, self._server = self._server, None
        await close_unix(server, self.socket, 0)

    def assign(
        self, namespace: str, pod: str, container: str, resource: str, device_ids: Sequence[str]
    ) -> None:
        """Record that `container` of `namespace/pod` holds `device_ids` of `resource`."""
        held = self._container(namespace, pod, container)
        held.devices.setdefault(resource, []).extend(device_ids)

    def assign_claim(
        self,
        namespace: str,
        pod: str,
        container: str,
        claim_namespace: str,
        claim_name: str,
        driver: str,
        pool: str,
        device: str,
    ) -> None:
        """Record that the prepared claim `claim_namespace/claim_name` gives `container` of
        `namespace/pod` the device `driver`/`pool`/`device` (one call per device of the claim,
        and per container that uses it)."""
        held = self._container(namespace, pod, container)
        devices = held.claims.setdefault((claim_namespace, claim_name), [])
        devices.append((driver, pool, device))

    def release(self, namespace: str, pod: str) -> None:
        """The pod ended: its devices and its claims' devices are no longer reported."""
        self._pods.pop((namespace, pod), None)

    def _container(self, namespace: str, pod: str, container: str) -> _Container:
        return self._pods.setdefault((namespace, pod), {}).setdefault(container, _Container())

    async def List(
        self,
        request: api_pb2.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[
            api_pb2.ListPodResourcesRequest, api_pb2.ListPodResourcesResponse
        ],
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=pod,
                    namespace=namespace,
                    containers=[held.message(name) for name, held in containers.items()],
                )
                for (namespace, pod), containers in self._pods.items()
            ]
        )
