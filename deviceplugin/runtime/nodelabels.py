"""Writes this node's GPU labels (`model.gpulabels`): into an NFD `NodeFeature` when NFD's CRD
is served, else onto the Node itself.

On the Node, one JSON merge patch sets the labels that differ and removes our keys that no
longer apply (a MIG profile gone after a re-cut); nobody else's key is in the patch. With NFD,
the NodeFeature `<node>-deviceplugin` in the pod's namespace holds the whole set and NFD's
master applies it. Nothing is removed when the plugin stops: a restart never unlabels a node.
"""

from __future__ import annotations

from collections.abc import Mapping

from deviceplugin.model.gpulabels import owned
from deviceplugin.model.jsonobject import JsonObject
from deviceplugin.runtime.apiclient import ApiClient, ApiError, node_path

NFD_GROUP = "/apis/nfd.k8s-sigs.io/v1alpha1"
NFD_NODE_LABEL = "nfd.node.kubernetes.io/node-name"
MERGE_PATCH = "application/merge-patch+json"


def label_patch(wanted: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str | None]:
    """The label changes that make `current` carry `wanted`: our keys only, None removes."""
    patch: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    patch.update({key: None for key in current if owned(key) and key not in wanted})
    return patch


class LabelWriter:
    """Keeps `wanted` labels on one node, by NodeFeature or by Node patch."""

    def __init__(self, client: ApiClient, node_name: str, namespace: str) -> None:
        self._client = client
        self._node = node_name
        self._namespace = namespace
        self._nfd: bool | None = None  # decided at the first write
        self.target = ""  # "NodeFeature" or "Node", once decided

    async def write(self, wanted: Mapping[str, str], node: JsonObject) -> bool:
        """Bring the labels in line with `wanted`; True when something was written. Raises
        ApiError."""
        if self._nfd is None:
            self._nfd = await self._nfd_served()
            self.target = "NodeFeature" if self._nfd else "Node"
        if self._nfd:
            return await self._write_node_feature(dict(wanted))
        current = (node.get("metadata") or {}).get("labels") or {}
        patch = label_patch(wanted, current)
        if not patch:
            return False
        body: JsonObject = {"metadata": {"labels": patch}}
        await self._client.request("PATCH", node_path(self._node), body, MERGE_PATCH)
        return True

    async def _nfd_served(self) -> bool:
        try:
            group = await self._client.request("GET", NFD_GROUP)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == "nodefeatures" for r in group.get("resources") or [])

    async def _write_node_feature(self, wanted: dict[str, str]) -> bool:
        name = f"{self._node}-deviceplugin"
        base = f"{NFD_GROUP}/namespaces/{self._namespace}/nodefeatures"
        body: JsonObject = {
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
            "kind": "NodeFeature",
            "metadata": {
                "name": name,
                "namespace": self._namespace,
                "labels": {NFD_NODE_LABEL: self._node},
            },
            "spec": {"labels": wanted},
        }
        try:
            current = await self._client.request("GET", f"{base}/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            await self._client.request("POST", base, body)
            return True
        if (current.get("spec") or {}).get("labels") == wanted:
            return False
        body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
        await self._client.request("PUT", f"{base}/{name}", body)
        return True
