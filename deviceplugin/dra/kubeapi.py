"""The API-server calls the DRA driver makes, through the async Kubernetes client.

`connect()` builds a client from `--kubeconfig`, from the pod's service account (in-cluster),
or from a plain URL (the stand-in of `sim/apiserver.py`); `KubeApi` lists, watches, creates,
replaces and deletes this node's ResourceSlices and reads ResourceClaims, and remembers whether the
latest call got an answer (`unreachable`, for readiness). Objects travel as plain JSON
dicts both ways (`_preload_content=False`), so what the publisher compares is exactly what the
server stored, without a round trip through the client's generated models. Every failure leaves
as `KubeApiError` (`ConflictError` for 409), so callers handle one exception type.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.jsonobject import JsonObject, json_object


class KubeApiError(DevicePluginError):
    """An API call failed: `status` is the HTTP status, 0 when no answer came."""

    def __init__(self, message: str, status: int = 0) -> None:
        self.status = status
        super().__init__(message)


class ConflictError(KubeApiError):
    """409: the object changed since it was read, or already exists."""


class SliceList(NamedTuple):
    """The slices a list found, and the resourceVersion a watch of what follows starts at."""

    items: list[JsonObject]
    version: str


WATCH_SECONDS = 300  # asked of the server, so that a watch ends and starts afresh now and then
WATCH_GRACE_SECONDS = 30  # then a watch the server never ended counts as a lost connection


async def connect(kubeconfig: str | None = None, host: str | None = None) -> KubeApi:
    """A client for `host` (a URL, no credentials), else the kubeconfig file, else in-cluster
    config. Raises ConfigError when none can be loaded."""
    configuration = client.Configuration()
    try:
        if host is not None:
            configuration.host = host
        elif kubeconfig is not None:
            await config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError) as err:
        raise ConfigError("kubeconfig", f"cannot load Kubernetes client config: {err}") from err
    return KubeApi(client.ApiClient(configuration=configuration))


class KubeApi:
    """ResourceSlices (cluster-scoped) and ResourceClaims of `resource.k8s.io/v1`."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._client = api_client
        self._resource = client.ResourceV1Api(api_client)
        self.unreachable: str | None = None  # why the latest call got no answer; None if it did

    async def list_slices(self, node: str, driver: str) -> SliceList:
        """This node's slices of `driver`, as the server stores them."""
        answer = await self._call(
            self._resource.list_resource_slice, field_selector=_slices_of(node, driver)
        )
        items = answer.get("items") or []
        version = (answer.get("metadata") or {}).get("resourceVersion") or ""
        return SliceList([item for item in items if isinstance(item, dict)], str(version))

    async def watch_slices(
        self, node: str, driver: str, since: str
    ) -> AsyncIterator[tuple[str, JsonObject]]:
        """The changes to this node's slices of `driver` after resourceVersion `since`, as
        (ADDED | MODIFIED | DELETED, slice), until the server ends the watch (about every
        WATCH_SECONDS). A refused watch, an ERROR event (410 Gone: `since` is too old) or a lost
        connection raises KubeApiError."""
        request: Any = self._resource.list_resource_slice  # unparsed: an aiohttp response
        try:
            response: aiohttp.ClientResponse = await request(
                field_selector=_slices_of(node, driver),
                watch=True,
                resource_version=since,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _preload_content=False,
                _request_timeout=WATCH_SECONDS + WATCH_GRACE_SECONDS,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            self.unreachable = f"API server unreachable: {err!r}"
            raise KubeApiError(self.unreachable) from err
        try:
            self.unreachable = None
            if response.status != 200:
                answer = json_object(await response.read())
                message = f"watch refused with {response.status}: {answer.get('message')!r}"
                raise KubeApiError(message, response.status)
            while line := await response.content.readline():
                event = json.loads(line)  # not JSON, or not an event: lost, list again
                if not isinstance(event, dict):
                    raise ValueError(f"not a watch event: {line[:100]!r}")
                kind, item = event.get("type"), event.get("object")
                if kind == "ERROR" and isinstance(item, dict):
                    message = f"watch ended: {item.get('message')!r}"
                    raise KubeApiError(message, int(item.get("code") or 0))
                if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(item, dict):
                    yield kind, item
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
            raise KubeApiError(f"watch of ResourceSlices lost: {err!r}") from err
        finally:
            response.close()  # a watch cut short leaves a body unread: not a reusable connection

    async def create_slice(self, body: JsonObject) -> JsonObject:
        return await self._call(self._resource.create_resource_slice, body)

    async def replace_slice(self, name: str, body: JsonObject) -> JsonObject:
        """PUT; a `metadata.resourceVersion` in `body` makes it conditional (409 if stale)."""
        return await self._call(self._resource.replace_resource_slice, name, body)

    async def delete_slice(self, name: str) -> None:
        """Delete; one already gone counts as deleted."""
        try:
            await self._call(self._resource.delete_resource_slice, name)
        except KubeApiError as err:
            if err.status != 404:
                raise

    async def read_claim(self, namespace: str, name: str) -> JsonObject:
        """One ResourceClaim with its status (the allocation the kubelet side prepares)."""
        return await self._call(self._resource.read_namespaced_resource_claim, name, namespace)

    async def close(self) -> None:
        await self._client.close()

    async def _call(self, method: Any, *args: Any, **kwargs: Any) -> JsonObject:
        try:
            response = await method(*args, _preload_content=False, **kwargs)
            try:
                status, data = response.status, await response.read()
            finally:
                response.release()
        except ApiException as err:
            self.unreachable = None
            raise KubeApiError(f"API call failed: {err.reason}", err.status or 0) from err
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            self.unreachable = f"API server unreachable: {err!r}"
            raise KubeApiError(self.unreachable) from err
        self.unreachable = None
        answer = json_object(data)
        if not 200 <= status <= 299:
            message = f"API server answered {status}: {answer.get('message') or data[:200]!r}"
            raise (ConflictError if status == 409 else KubeApiError)(message, status)
        return answer


def _slices_of(node: str, driver: str) -> str:
    return f"spec.nodeName={node},spec.driver={driver}"
