"""The API-server calls the DRA driver makes, on the daemons' one client
(`runtime.kubeclient`): this node's ResourceSlices of the driver (list, watch, create, replace,
delete, a dry-run create), ResourceClaims (read) and the server's version. Every call has the
client's deadline and fails as `KubeError` (`ConflictError` for 409).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from deviceplugin.model.jsonobject import JsonObject
from deviceplugin.runtime import kubeclient
from deviceplugin.runtime.kubeclient import (
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
    Listed,
)


class KubeApi:
    """ResourceSlices (cluster-scoped) and ResourceClaims of `resource.k8s.io/v1`."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    @property
    def unreachable(self) -> str | None:
        """Why the latest call got no answer; None when it got one."""
        return self._client.unreachable

    async def list_slices(self, node: str, driver: str) -> Listed:
        """This node's slices of `driver`, as the server stores them."""
        return await self._client.list(RESOURCE_SLICES, _slices_of(node, driver))

    def watch_slices(
        self, node: str, driver: str, since: str
    ) -> AsyncIterator[tuple[str, JsonObject]]:
        """The changes to this node's slices of `driver` after resourceVersion `since`
        (`KubeClient.watch`)."""
        return self._client.watch(RESOURCE_SLICES, _slices_of(node, driver), since)

    async def create_slice(self, body: JsonObject) -> JsonObject:
        return await self._client.create(RESOURCE_SLICES, body)

    async def dry_run_slice(self, body: JsonObject) -> JsonObject:
        """`body` as the server would store it (gated fields it drops are gone); nothing stored."""
        return await self._client.create(RESOURCE_SLICES, body, dry_run=True)

    async def server_version(self) -> str:
        """The API server's `gitVersion`."""
        return await self._client.server_version()

    async def replace_slice(self, name: str, body: JsonObject) -> JsonObject:
        """PUT; a `metadata.resourceVersion` in `body` makes it conditional (409 if stale)."""
        return await self._client.replace(RESOURCE_SLICES, body)

    async def delete_slice(self, name: str) -> None:
        """Delete; one already gone counts as deleted."""
        await self._client.delete(RESOURCE_SLICES, name)

    async def read_claim(self, namespace: str, name: str) -> JsonObject:
        """One ResourceClaim with its status (the allocation the kubelet side prepares)."""
        return await self._client.get(RESOURCE_CLAIMS, name, namespace=namespace)

    async def close(self) -> None:
        await self._client.close()


def _slices_of(node: str, driver: str) -> dict[str, str]:
    return {"spec.nodeName": node, "spec.driver": driver}


def connect(
    kubeconfig: str | None = None,
    env: Mapping[str, str] | None = None,
    server: str | None = None,
) -> KubeApi:
    """The driver's calls on a client from `kubeconfig`, the pod's service account (`env`) or
    a plain `server` URL (`kubeclient.connect`). Raises ConfigError."""
    return KubeApi(kubeclient.connect(kubeconfig, env or {}, server))
