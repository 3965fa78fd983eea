"""The one Kubernetes client of both daemons: lightkube, with a deadline on every call.

`connect()` is the one place a client is built: from `--kubeconfig`, from the pod's service
account (in-cluster; its projected token is read again when the server answers 401), or from a
plain URL (the API-server stand-in of `sim/apiserver.py`). Every call has a deadline: the
connection, each read and write, and the whole call (CALL_SECONDS), so an API server that
accepts connections and never answers costs a caller at most that long. A watch is bounded by
the server's own timeout plus a grace (a connection that died without a word is not waited on
for ever), and its requests are paced (SHORTEST_WATCH_SECONDS) so a server that ends every
watch at once never makes a busy loop.

Objects travel as plain JSON dicts (lightkube's generic resources, which keep every field the
server sent), so what the publisher compares is exactly what the server stored. Every failure
leaves as `KubeError` (`ConflictError` for 409): `status` is the HTTP status, 0 when no answer
came in time. `unreachable` says why the latest call got no answer, for readiness.

Why lightkube and not kubernetes_asyncio: docs/architecture.md, "The Kubernetes client".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.jsonobject import JsonObject
from deviceplugin.model.yamlimport import yaml
from deviceplugin.runtime.leanimports import deferring, with_tls, without_http2

with_tls()  # httpx speaks TLS through anyio; asyncio's own TLS then works too
with deferring():  # what the client's libraries load for paths the daemons do not take
    without_http2()  # no client here asks for HTTP/2
    import httpx2
    import msgspec
    from lightkube import AsyncClient, KubeConfig
    from lightkube.config.client_adapter import ConnectionParams
    from lightkube.config.models import Cluster, User
    from lightkube.core.exceptions import ApiError, NotReadyError
    from lightkube.core.exceptions import ConfigError as LightkubeConfigError
    from lightkube.generic_resource import create_global_resource, create_namespaced_resource
    from lightkube.types import PatchType

T = TypeVar("T")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CONNECT_SECONDS = 5.0  # to open a connection
IO_SECONDS = 10.0  # for each read or write of a call
CALL_SECONDS = 15.0  # for a whole call, however slowly the server trickles its answer
WATCH_SECONDS = 300  # asked of the server, so that a watch ends and starts afresh now and then
WATCH_GRACE_SECONDS = 30  # then a watch the server never ended counts as a lost connection
SHORTEST_WATCH_SECONDS = 1.0  # watch requests are at least this far apart

# The resources the daemons use, as generic resources: plain dicts both ways.
NODES = create_global_resource("", "v1", "Node", "nodes")
EVENTS = create_namespaced_resource("", "v1", "Event", "events")
RESOURCE_SLICES = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")
RESOURCE_CLAIMS = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
)
NODE_FEATURES = create_namespaced_resource(
    "nfd.k8s-sigs.io", "v1alpha1", "NodeFeature", "nodefeatures"
)


# What a kubeconfig that cannot work raises, read by lightkube: not YAML, not a mapping, a
# missing context, file or field.
CONFIG_ERRORS = (
    LightkubeConfigError,
    OSError,
    KeyError,
    ValueError,
    TypeError,
    AttributeError,
    yaml.YAMLError,
    msgspec.MsgspecError,
)


class KubeError(DevicePluginError):
    """An API call failed: `status` is the HTTP status, 0 when no answer came in time."""

    def __init__(self, message: str, status: int = 0) -> None:
        self.status = status
        super().__init__(message)

    @property
    def refused(self) -> bool:
        """The server refused the request itself (403: RBAC, or an admission policy such as
        the chart's own-node ValidatingAdmissionPolicies; 422 from a policy it could not
        evaluate): asking again changes nothing until an operator does."""
        return self.status == 403 or (
            self.status == 422 and "ValidatingAdmissionPolicy" in str(self)
        )


class ConflictError(KubeError):
    """409: the object changed since it was read, or already exists."""


class Listed(NamedTuple):
    """What a list found, and the resourceVersion a watch of what follows starts at."""

    items: list[JsonObject]
    version: str


def load_config(
    kubeconfig: str | None, env: Mapping[str, str], server: str | None = None
) -> KubeConfig:
    """`server` (a URL, no credentials), else the kubeconfig file, else the pod's service
    account. Raises ConfigError naming what is wrong."""
    try:
        if server is not None:
            return KubeConfig.from_one(cluster=Cluster(server=server), user=User())
        if kubeconfig is not None:
            return KubeConfig.from_file(kubeconfig)
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        token = SERVICE_ACCOUNT / "token"
        if not host or not port or not token.is_file():
            raise ConfigError(
                "kubeconfig",
                "no --kubeconfig and not in a pod with a service account token"
                f" (KUBERNETES_SERVICE_HOST/PORT unset or {token} missing)",
            )
        return KubeConfig.from_service_account(SERVICE_ACCOUNT)
    except CONFIG_ERRORS as err:
        source = kubeconfig or "the service account"
        message = f"cannot load Kubernetes client config from {source}: {err}"
        raise ConfigError("kubeconfig", message) from err


def connect(
    kubeconfig: str | None, env: Mapping[str, str], server: str | None = None
) -> KubeClient:
    """A client (no request sent yet). Raises ConfigError when no config can be loaded."""
    config = load_config(kubeconfig, env, server)
    try:
        single = config.get()
        assert single is not None
        if single.cluster.server.startswith("http://"):
            # no TLS: a TLS context would load the system's CA bundle (4.6 MiB) for nothing
            cluster = msgspec.structs.replace(single.cluster, insecure=True)
            single = single._replace(cluster=cluster)
        timeout = httpx2.Timeout(IO_SECONDS, connect=CONNECT_SECONDS)
        params = ConnectionParams(timeout=timeout, trust_env=False).httpx_params(single)
        transport = _PacedWatches(
            httpx2.AsyncHTTPTransport(verify=params["verify"], trust_env=False)
        )
        client = AsyncClient(single, timeout=timeout, trust_env=False, transport=transport)
    except (*CONFIG_ERRORS, AssertionError) as err:
        raise ConfigError("kubeconfig", f"cannot use the Kubernetes client config: {err}") from err
    return KubeClient(client)


class KubeClient:
    """Calls to one API server; `close()` at the end."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self.unreachable: str | None = None  # why the latest call got no answer; None if it did

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> JsonObject:
        return await self._object(
            f"get {_kind(resource)} {name}",
            self._client.get(resource, name, namespace=namespace),
        )

    async def list(
        self, resource: Any, fields: Mapping[str, str], namespace: str | None = None
    ) -> Listed:
        """The objects whose fields equal `fields`, with the list's resourceVersion."""

        async def listing() -> Listed:
            found = self._client.list(resource, fields=dict(fields), namespace=namespace)
            items = [dict(item) async for item in found]
            try:
                return Listed(items, found.resourceVersion)
            except NotReadyError:  # a list answered without a resourceVersion
                return Listed(items, "")

        return await self._call(f"list {_kind(resource)}", listing())

    async def watch(
        self, resource: Any, fields: Mapping[str, str], since: str, namespace: str | None = None
    ) -> AsyncIterator[tuple[str, JsonObject]]:
        """The changes to the objects whose fields equal `fields` after resourceVersion
        `since`, as (ADDED | MODIFIED | DELETED, object), for about WATCH_SECONDS (the server
        ends each watch; it is resumed from the last version seen). Returns when that time is
        up; a refused watch, an ERROR event (410 Gone: `since` is too old) or a lost connection
        raises KubeError."""
        what = f"watch of {_kind(resource)}"
        events = self._client.watch(
            resource,
            namespace=namespace,
            fields=dict(fields),
            resource_version=since,
            server_timeout=WATCH_SECONDS,
        ).__aiter__()
        loop = asyncio.get_running_loop()
        ends = loop.time() + WATCH_SECONDS + WATCH_GRACE_SECONDS
        try:
            while (left := ends - loop.time()) > 0:
                # The deadline bounds the wait for the next event only, never the caller's
                # handling of one: a timeout spanning a yield would cancel the caller instead.
                try:
                    async with asyncio.timeout(left):
                        kind, item = await events.__anext__()
                except (StopAsyncIteration, TimeoutError):
                    return  # time to list afresh
                except Exception as err:
                    raise self._failure(what, err) from err
                self.unreachable = None
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield kind, dict(item)
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]

    async def create(self, resource: Any, body: JsonObject, dry_run: bool = False) -> JsonObject:
        """POST; with `dry_run` (`?dryRun=All`) the server answers the object as it would store
        it and stores nothing."""
        name = (body.get("metadata") or {}).get("name") or "(generated)"
        return await self._object(
            f"{'dry-run ' if dry_run else ''}create {_kind(resource)} {name}",
            self._client.create(resource(body), dry_run=dry_run),
        )

    async def server_version(self) -> str:
        """The API server's `gitVersion` (GET /version), e.g. `v1.35.4`."""

        async def get() -> str:
            http = self._client._client._client  # lightkube has no call for /version
            response = await http.get("/version")
            response.raise_for_status()
            return str(response.json().get("gitVersion") or "")

        return await self._call("get /version", get())

    async def replace(self, resource: Any, body: JsonObject) -> JsonObject:
        """PUT; a `metadata.resourceVersion` in `body` makes it conditional (409 if stale)."""
        name = (body.get("metadata") or {}).get("name")
        return await self._object(
            f"replace {_kind(resource)} {name}", self._client.replace(resource(body))
        )

    async def merge_patch(self, resource: Any, name: str, patch: JsonObject) -> JsonObject:
        return await self._object(
            f"patch {_kind(resource)} {name}",
            self._client.patch(resource, name, patch, patch_type=PatchType.MERGE),
        )

    async def delete(self, resource: Any, name: str) -> None:
        """Delete; one already gone counts as deleted."""
        try:
            await self._call(
                f"delete {_kind(resource)} {name}", self._client.delete(resource, name)
            )
        except KubeError as err:
            if err.status != 404:
                raise

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.close()

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(CALL_SECONDS):
                answer = await call
        except Exception as err:
            raise self._failure(what, err) from err
        self.unreachable = None
        return answer

    async def _object(self, what: str, call: Awaitable[Any]) -> JsonObject:
        """One object the server answered with, as a plain dict."""
        answer = await self._call(what, call)
        return dict(answer) if isinstance(answer, dict) else {}

    def _failure(self, what: str, err: Exception) -> KubeError:
        """`err` as the one error type, noting whether the server answered."""
        if isinstance(err, KubeError):
            return err
        if isinstance(err, ApiError):
            self.unreachable = None
            status = err.status.code or 0
            message = f"{what}: {status} {err.status.reason or ''}: {err.status.message or ''}"
            return (ConflictError if status == 409 else KubeError)(message, status)
        if isinstance(err, httpx2.HTTPStatusError):  # an answer lightkube did not take as JSON
            self.unreachable = None
            status = err.response.status_code
            message = f"{what}: {status} {err.response.reason_phrase}"
            said = _message(err.response)
            if said:
                message += f": {said}"
            return (ConflictError if status == 409 else KubeError)(message, status)
        if isinstance(err, msgspec.DecodeError | msgspec.ValidationError | ValueError):
            self.unreachable = None
            return KubeError(f"{what}: the answer is not a Kubernetes object: {err}")
        if isinstance(err, TimeoutError | httpx2.TimeoutException):
            self.unreachable = f"API server did not answer {what} in time"
        else:
            self.unreachable = f"API server unreachable ({what}): {err!r}"
        return KubeError(self.unreachable)


def _message(response: httpx2.Response) -> str:
    """The `message` of a Status body, whatever its Content-Type says; "" when there is none."""
    try:
        body = msgspec.json.decode(response.read())
    except Exception:  # not JSON, or a streamed body: the status line says enough
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return str(message)[:1024] if message else ""


def _kind(resource: Any) -> str:
    return str(getattr(resource, "__name__", resource))


class _PacedWatches(httpx2.AsyncBaseTransport):
    """The transport, with watch requests at least SHORTEST_WATCH_SECONDS apart: lightkube
    resumes a watch the server ended at once, and a server that ends every watch at once must
    not make that a busy loop."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner
        self._next_watch = 0.0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.params.get("watch") == "true":
            wait = self._next_watch - time.monotonic()
            self._next_watch = max(self._next_watch, time.monotonic()) + SHORTEST_WATCH_SECONDS
            if wait > 0:
                await asyncio.sleep(wait)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
