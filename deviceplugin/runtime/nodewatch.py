"""This node's Node object, followed as the API server changes it.

Only the own Node is read: a list and a watch with the field selector `metadata.name=<node>`,
which the RBAC of the chart allows (`list`, `watch` on nodes) and which costs the API server
one object per node. Every version seen is handed to `on_node`. A lost connection, an expired
resourceVersion (410) or a refusal is retried after a backoff that doubles up to
BACKOFF_MAX_SECONDS, with a fresh list; a watch the client ended after its time (about five
minutes) lists afresh at once. The kubelet is served meanwhile, as nothing here holds the
loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from deviceplugin.model.jsonobject import JsonObject
from deviceplugin.model.log import log_event
from deviceplugin.runtime.kubeclient import NODES, KubeClient, KubeError

logger = logging.getLogger(__name__)

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0

OnNode = Callable[[JsonObject], Awaitable[None]]


class NodeWatch:
    """Lists, then watches, one Node; `run` until cancelled."""

    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        on_node: OnNode,
        backoff_first: float = BACKOFF_FIRST_SECONDS,
        backoff_max: float = BACKOFF_MAX_SECONDS,
    ) -> None:
        self.node_name = node_name
        self.error: str | None = None  # why the latest try to follow the Node failed
        self.seen = asyncio.Event()  # set once the Node has been read
        self._client = client
        self._on_node = on_node
        self._backoff_first = backoff_first
        self._backoff_max = backoff_max

    async def run(self) -> None:
        delay = self._backoff_first
        while True:
            try:
                await self._follow()
                delay = self._backoff_first  # the watch ended as watches do: start again
            except KubeError as exc:
                if self.error is None:
                    log_event(
                        logger,
                        "node.watch.failed",
                        logging.WARNING,
                        node=self.node_name,
                        error=str(exc),
                        retry="with backoff; the kubelet is served meanwhile",
                    )
                self.error = str(exc)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self._backoff_max)

    async def _follow(self) -> None:
        """One list and the watch that follows it, until the watch ends."""
        fields = {"metadata.name": self.node_name}
        listed = await self._client.list(NODES, fields)
        if not listed.items:
            raise KubeError(f"node {self.node_name!r} not found", 404)
        await self._seen(listed.items[0])
        async for kind, node in self._client.watch(NODES, fields, listed.version):
            if kind in ("ADDED", "MODIFIED"):
                await self._seen(node)

    async def _seen(self, node: JsonObject) -> None:
        if self.error is not None:
            log_event(logger, "node.watch.restored", node=self.node_name)
        self.error = None
        self.seen.set()
        await self._on_node(node)
