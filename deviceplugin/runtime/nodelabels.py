"""Writes this node's GPU labels (`model.gpulabels`): into an NFD `NodeFeature` when NFD's CRD
is served, else onto the Node itself.

On the Node, one JSON merge patch sets the labels that differ and removes our keys that no
longer apply (a MIG profile gone after a re-cut); nobody else's key is in the patch. With NFD,
the NodeFeature `<node>-deviceplugin` in the pod's namespace holds the whole set and NFD's
master applies it. NFD counts as installed when its NodeFeature endpoint answers: the first
write reads the object and creates it when it is missing, and a create answered 404 means
the resource type itself is not served. Nothing is removed when the plugin stops: a restart
never unlabels a node.
"""

from __future__ import annotations

from collections.abc import Mapping

from deviceplugin.model.gpulabels import owned
from deviceplugin.model.jsonobject import JsonObject
from deviceplugin.runtime.kubeclient import NODE_FEATURES, NODES, KubeClient, KubeError

NFD_NODE_LABEL = "nfd.node.kubernetes.io/node-name"


def label_patch(wanted: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str | None]:
    """The label changes that make `current` carry `wanted`: our keys only, None removes."""
    patch: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    patch.update({key: None for key in current if owned(key) and key not in wanted})
    return patch


class LabelWriter:
    """Keeps `wanted` labels on one node, by NodeFeature or by Node patch."""

    def __init__(self, client: KubeClient, node_name: str, namespace: str) -> None:
        self._client = client
        self._node = node_name
        self._namespace = namespace
        self._nfd: bool | None = None  # decided at the first write
        self.target = ""  # "NodeFeature" or "Node", once decided

    async def write(self, wanted: Mapping[str, str], node: JsonObject) -> bool:
        """Bring the labels in line with `wanted`; True when something was written. Raises
        KubeError."""
        if self._nfd is not False:
            written = await self._write_node_feature(dict(wanted))
            if written is not None:
                self._nfd, self.target = True, "NodeFeature"
                return written
            self._nfd, self.target = False, "Node"
        current = (node.get("metadata") or {}).get("labels") or {}
        patch = label_patch(wanted, current)
        if not patch:
            return False
        await self._client.merge_patch(NODES, self._node, {"metadata": {"labels": patch}})
        return True

    async def _write_node_feature(self, wanted: dict[str, str]) -> bool | None:
        """Whether the NodeFeature was written; None when NFD's resource is not served."""
        name = f"{self._node}-deviceplugin"
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
            current = await self._client.get(NODE_FEATURES, name, namespace=self._namespace)
        except KubeError as exc:
            if exc.status != 404:
                raise
            try:
                await self._client.create(NODE_FEATURES, body)
            except KubeError as missing:
                if missing.status == 404 and self._nfd is None:
                    return None  # no such resource: NFD is not installed
                raise
            return True
        if (current.get("spec") or {}).get("labels") == wanted:
            return False
        body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
        await self._client.replace(NODE_FEATURES, body)
        return True
