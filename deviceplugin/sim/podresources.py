"""A kubelet PodResources emulator: which container holds which device, as the kubelet reports it.

Serves `v1.PodResourcesLister/List` on `<root>/pod-resources/kubelet.sock`, where `<root>` is the
emulated kubelet root (the KubeletEmulator then lives in `<root>/device-plugins`, as on a node).
A test or the demo says who holds what with `assign`, the way the kubelet's device manager
records an Allocate it made; the other PodResources calls answer UNIMPLEMENTED, as from a
kubelet with those features off.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc

from deviceplugin.node.unixgrpc import close_unix, listen_unix
from deviceplugin.wire.podresources.v1 import api_pb2, api_pb2_grpc

# (namespace, pod) -> container -> resource -> device IDs, in the order they were assigned
_Assignments = dict[tuple[str, str], dict[str, dict[str, list[str]]]]


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
        containers = self._pods.setdefault((namespace, pod), {})
        containers.setdefault(container, {}).setdefault(resource, []).extend(device_ids)

    def release(self, namespace: str, pod: str) -> None:
        """The pod ended: its devices are no longer reported."""
        self._pods.pop((namespace, pod), None)

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
                    containers=[
                        api_pb2.ContainerResources(
                            name=container,
                            devices=[
                                api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                                for resource, ids in resources.items()
                            ],
                        )
                        for container, resources in containers.items()
                    ],
                )
                for (namespace, pod), containers in self._pods.items()
            ]
        )
