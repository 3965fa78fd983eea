"""A stand-in for the Kubernetes API server's `resource.k8s.io/v1` endpoints, on 127.0.0.1.

It serves what the DRA driver and its tests use: ResourceSlices (list with `fieldSelector` and
`labelSelector` equality terms, watch from a resourceVersion, create, replace, delete, and
delete-collection, with which the kubelet wipes a node's slices) and ResourceClaims (get by
namespace/name; create, so tests and the demo can seed claims). Like a real API server it

- validates every object it receives against the `resource.k8s.io/v1` OpenAPI schema
  (kubernetes-validate, strict, Kubernetes 1.34: the first release serving v1) and against the
  limits the schema cannot express (ResourceSlice validation in Kubernetes' `types.go`), and
  refuses an invalid one with `422 Invalid`;
- assigns `uid`, `resourceVersion` and `creationTimestamp`, answers `409 AlreadyExists` for a
  second create and `409 Conflict` for a replace whose `resourceVersion` is stale.

It answers `/version` as the cluster's Kubernetes (1.37.2 unless `version` is set; NVIDIA's DRA
driver picks its ResourceSlice layout from it). Its feature gates are on, but for those named in
`gates_off` (`emulate("1.35")` sets both to that release's defaults): like a real API server it
then drops the gated fields of every ResourceSlice written from then on, silently
(`drop_gated`; a real server keeps a field the stored object already had, and no test needs
that). A create with `?dryRun=All` answers the object as it would be stored, gated
fields dropped, and stores nothing (`dry_runs` records each answer).

It serves `serve`'s own-Node calls too: Nodes (list with the `metadata.name` field selector,
watch, get, JSON merge patch of labels, checked as label keys and values are checked), Events
(create, validated as v1 Events) and, with `nfd=True`, NFD's `NodeFeature` objects and the API
group discovery that tells whether NFD is installed. `add_node` and `set_node_labels` stand in
for the kubelet registering a node and for `kubectl label`, `wipe` for the kubelet deleting a
node's slices; watches see their changes at once, and `end_watches` cuts every watch as a lost
connection would.

A request body of a content type given in `decoders` (client-go's typed clients send
`application/vnd.kubernetes.protobuf`) is read by that decoder as the JSON object it stands for,
then validated and stored as JSON is. A slice watch with `sendInitialEvents=true` (client-go's
informers since Kubernetes 1.35) starts with the current slices and a bookmark, as the API
server's watch-list does.

`fail_next(status, count)` makes the next requests fail, `refuse_writes` answers writes as a
denying admission policy does, `compact()` makes a slice watch from
an older resourceVersion fail with 410 Gone, and `requests` records every call, so tests can
check retries and that an unchanged publish writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

import kubernetes_validate
from aiohttp import web

JsonObject = dict[str, Any]

SCHEMA_VERSION = "1.34"
# What `/version` reports: the Kubernetes e2e/cluster runs.
SERVER_VERSION: JsonObject = {"major": "1", "minor": "37", "gitVersion": "v1.37.2"}
# The ResourceSlice gates each release has off by default (docs/dra/versions.md).
PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
DEVICE_TAINTS = "DRADeviceTaints"
_ALPHA_IN_134_135 = frozenset({PARTITIONABLE_DEVICES, CONSUMABLE_CAPACITY, DEVICE_TAINTS})
DEFAULT_GATES_OFF: dict[str, frozenset[str]] = {
    "1.34": _ALPHA_IN_134_135,
    "1.35": _ALPHA_IN_134_135,
    "1.36": frozenset(),
    "1.37": frozenset(),
}
EMULATED_PATCH = {"1.34": 4, "1.35": 4, "1.36": 3, "1.37": 2}  # the newest patch of each
PREFIX = "/apis/resource.k8s.io/v1"
# The API server's own ResourceSlice limits (k8s.io/api resource/v1 types.go).
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64  # ...WithTaintsOrConsumesCounters
MAX_COUNTER_SETS = 8  # per slice
MAX_COUNTERS = 32  # per counter set, and per device counter consumption
MAX_COUNTER_CONSUMPTIONS = 2  # per device
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE = 64
MAX_TAINTS = 4
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_QUALIFIED = re.compile(
    r"(?:([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?"
    r"[A-Za-z_][A-Za-z0-9_]{0,31}"
)
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?"
)
_SLICE_FIELDS: dict[str, Callable[[JsonObject], object]] = {
    "metadata.name": lambda o: o["metadata"].get("name"),
    "spec.nodeName": lambda o: o["spec"].get("nodeName"),
    "spec.driver": lambda o: o["spec"].get("driver"),
    "spec.pool.name": lambda o: o["spec"].get("pool", {}).get("name"),
}


_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NFD = "/apis/nfd.k8s-sigs.io/v1alpha1"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the annotation of a watch-list's bookmark


class _Watch(NamedTuple):
    resource: str  # "nodes" or "resourceslices"
    queue: asyncio.Queue[JsonObject | None]  # None ends the watch


class ApiServer:
    """Start with `await start()`; `url` is then `http://127.0.0.1:<port>`."""

    def __init__(
        self,
        nfd: bool = False,
        decoders: Mapping[str, Callable[[bytes], JsonObject]] | None = None,
        openapi: bool = True,
        gates_off: Iterable[str] = (),
    ) -> None:
        self._decoders = dict(decoders or {})  # content type -> the object a body of it holds
        # False: resource.k8s.io bodies skip the OpenAPI schema check (the 1.37 rules the schema
        # lacks still apply). For benchmarks only: in Python it costs far more than a real API
        # server's, and would be most of what a large publish is measured at.
        self._openapi = openapi
        self.nodes: dict[str, JsonObject] = {}
        self.events: list[JsonObject] = []
        self.node_features: dict[tuple[str, str], JsonObject] = {}
        self._nfd = nfd
        self._watches: list[_Watch] = []
        self.slices: dict[str, JsonObject] = {}
        self._slice_changes: list[JsonObject] = []  # the events a watch may resume from
        self._compacted = 0  # a slice watch from before this resourceVersion is refused (410)
        self.claims: dict[tuple[str, str], JsonObject] = {}
        self.requests: list[tuple[str, str]] = []
        self.rejected: list[str] = []  # why each 422 was answered
        self.gates_off = set(gates_off)  # whose fields every stored slice loses
        self.version: JsonObject = dict(SERVER_VERSION)  # what `/version` answers
        self.dry_runs: list[JsonObject] = []  # what each dry-run create answered
        self._versions = itertools.count(1)
        self._failures: list[int] = []
        self._refusal: str | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application(middlewares=[self._record])
        base = f"{PREFIX}/resourceslices"
        claim = f"{PREFIX}/namespaces/{{namespace}}/resourceclaims"
        app.router.add_get(base, self._list_slices)
        app.router.add_post(base, self._create_slice)
        app.router.add_delete(base, self._delete_slices)
        app.router.add_put(base + "/{name}", self._replace_slice)
        app.router.add_delete(base + "/{name}", self._delete_slice)
        app.router.add_post(claim, self._create_claim)
        app.router.add_get(claim + "/{name}", self._get_claim)
        app.router.add_get("/version", self._version)
        app.router.add_get("/api/v1/nodes", self._list_nodes)
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_post("/api/v1/namespaces/{namespace}/events", self._create_event)
        if self._nfd:
            features = NFD + "/namespaces/{namespace}/nodefeatures"
            app.router.add_get(NFD, self._nfd_group)
            app.router.add_post(features, self._create_node_feature)
            app.router.add_get(features + "/{name}", self._get_node_feature)
            app.router.add_put(features + "/{name}", self._replace_node_feature)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def emulate(self, release: str) -> None:
        """Answer as Kubernetes `release` ("1.34" to "1.37") with its default feature gates:
        `/version` says its newest patch, and the fields of the gates it has off are dropped
        from the slices written from now on (a real upgrade rewrites nothing either)."""
        major, minor = release.split(".")
        self.version = {
            "major": major,
            "minor": minor,
            "gitVersion": f"v{release}.{EMULATED_PATCH[release]}",
        }
        self.gates_off = set(DEFAULT_GATES_OFF[release])

    def fail_next(self, status: int, count: int = 1) -> None:
        """Answer the next `count` requests with `status` (a Status body, nothing stored)."""
        self._failures.extend([status] * count)

    def refuse_writes(self, message: str | None) -> None:
        """Answer every write with 403 and `message`, as an admission policy that denies it
        does, until called with None."""
        self._refusal = message

    def add_claim(self, claim: JsonObject) -> JsonObject:
        """Store a ResourceClaim as a create would (validated; raises ValueError if invalid)."""
        problem = _schema_problem(claim, "ResourceClaim")
        if problem:
            raise ValueError(problem)
        stored = self._stamp(claim)
        meta = stored["metadata"]
        self.claims[(meta.get("namespace", "default"), meta["name"])] = stored
        return stored

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> JsonObject:
        """Register a Node (as a kubelet does); watchers see it ADDED."""
        node: JsonObject = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {})},
        }
        self.nodes[name] = self._stamp(node)
        self._notify("nodes", "ADDED", self.nodes[name])
        return self.nodes[name]

    def set_node_labels(self, name: str, changes: dict[str, str | None]) -> None:
        """Set (None: remove) labels of a Node by their real keys; watchers see it MODIFIED."""
        self._set_labels(name, changes)

    def compact(self) -> None:
        """Forget the slice changes so far, as etcd's compaction does: a watch from an older
        resourceVersion then gets `410 Gone` and must list again."""
        self._slice_changes.clear()
        self._compacted = next(self._versions)

    def open_watches(self, resource: str) -> int:
        """How many watches of `resource` ("nodes", "resourceslices") are open now."""
        return sum(1 for watch in self._watches if watch.resource == resource)

    def wipe(self, node: str, driver: str) -> None:
        """Delete a node's slices of `driver` as the kubelet's delete-collection does when it
        starts: watches see each one DELETED."""
        self._delete_matching({"spec.nodeName": node, "spec.driver": driver})

    def end_watches(self) -> None:
        """End every open watch, as a lost connection would."""
        for watch in self._watches:
            watch.queue.put_nowait(None)
        self._watches.clear()

    def _set_labels(self, name: str, changes: dict[str, str | None]) -> None:
        node = json.loads(json.dumps(self.nodes[name]))
        labels = node["metadata"].setdefault("labels", {})
        for key, value in changes.items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        self.nodes[name] = self._stamp(node, self.nodes[name]["metadata"])
        self._notify("nodes", "MODIFIED", self.nodes[name])

    def _notify(self, resource: str, kind: str, item: JsonObject) -> None:
        event = {"type": kind, "object": item}
        if resource == "resourceslices":
            self._slice_changes.append(event)
        for watch in self._watches:
            if watch.resource == resource:
                watch.queue.put_nowait(event)

    def _delete_matching(self, fields: dict[str, str]) -> None:
        for name, item in list(self.slices.items()):
            if all(_SLICE_FIELDS[k](item) == v for k, v in fields.items()):
                self._slice_deleted(name)

    def _slice_deleted(self, name: str) -> JsonObject:
        """Remove a slice; its DELETED event carries a new resourceVersion, as etcd's does."""
        gone = self.slices.pop(name)
        self._notify("resourceslices", "DELETED", self._stamp(gone, gone["metadata"]))
        return gone

    # --- request handling -----------------------------------------------------------------------

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if self._failures:
            code = self._failures.pop(0)
            return _status(code, "InternalError", f"injected failure {code}")
        if self._refusal is not None and request.method != "GET":
            return _status(403, "Forbidden", self._refusal)
        response: web.StreamResponse = await handler(request)
        return response

    async def _list_slices(self, request: web.Request) -> web.StreamResponse:
        wanted = _selector(request.query.get("fieldSelector", ""))
        labels = _selector(request.query.get("labelSelector", ""))
        for key in wanted:
            if key not in _SLICE_FIELDS:
                return _status(400, "BadRequest", f'field label not supported: "{key}"')

        def selected(item: JsonObject) -> bool:
            return all(_SLICE_FIELDS[k](item) == v for k, v in wanted.items()) and all(
                (item["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items()
            )

        if _watching(request):
            if _flag(request, "sendInitialEvents"):
                return await self._watch_list(request, selected)
            since = int(request.query.get("resourceVersion") or 0)
            if since < self._compacted:
                return await self._expired(request, since)
            missed = [e for e in self._slice_changes if _version(e["object"]) > since]
            return await self._stream(request, "resourceslices", missed, selected)
        items = [item for item in self.slices.values() if selected(item)]
        return _json(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSliceList",
                "metadata": {"resourceVersion": str(next(self._versions))},
                "items": items,
            }
        )

    async def _watch_list(
        self, request: web.Request, selected: Callable[[JsonObject], bool]
    ) -> web.StreamResponse:
        """A watch that starts with the current slices (`sendInitialEvents=true`, as client-go's
        informers ask since Kubernetes 1.35): an ADDED event for each, then the BOOKMARK that
        marks the end of the initial events, then each change."""
        current = [{"type": "ADDED", "object": item} for item in self.slices.values()]
        metadata = {
            "resourceVersion": str(next(self._versions)),
            "annotations": {INITIAL_EVENTS_END: "true"},
        }
        bookmark = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": metadata,
        }
        events = [*current, {"type": "BOOKMARK", "object": bookmark}]
        return await self._stream(request, "resourceslices", events, selected)

    async def _create_slice(self, request: web.Request) -> web.Response:
        body, problem = await self._receive(request, "ResourceSlice")
        if problem:
            return self._invalid(problem)
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if meta["name"] in self.slices:
            return _status(409, "AlreadyExists", f'resourceslices "{meta["name"]}" already exists')
        drop_gated(body, self.gates_off)
        if request.query.get("dryRun") == "All":
            answer = self._stamp(body)
            self.dry_runs.append(answer)
            return _json(answer, 201)
        stored = self._stamp(body)
        self.slices[meta["name"]] = stored
        self._notify("resourceslices", "ADDED", stored)
        return _json(stored, 201)

    async def _replace_slice(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body, problem = await self._receive(request, "ResourceSlice")
        if problem:
            return self._invalid(problem)
        current = self.slices.get(name)
        if current is None:
            return _not_found("resourceslices", name)
        if body["metadata"].get("name") != name:
            return self._invalid("metadata.name: the name of the object does not match the URL")
        given = body["metadata"].get("resourceVersion")
        if given and given != current["metadata"]["resourceVersion"]:
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on resourceslices "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        if body["spec"].get("driver") != current["spec"].get("driver"):
            return self._invalid("spec.driver: field is immutable")
        drop_gated(body, self.gates_off)
        stored = self._stamp(body, current["metadata"])
        self.slices[name] = stored
        self._notify("resourceslices", "MODIFIED", stored)
        return _json(stored)

    async def _delete_slice(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.slices:
            return _not_found("resourceslices", name)
        return _json(self._slice_deleted(name))

    async def _delete_slices(self, request: web.Request) -> web.Response:
        wanted = _selector(request.query.get("fieldSelector", ""))
        for key in wanted:
            if key not in _SLICE_FIELDS:
                return _status(400, "BadRequest", f'field label not supported: "{key}"')
        self._delete_matching(wanted)
        return _json({"apiVersion": "v1", "kind": "Status", "status": "Success"})

    async def _create_claim(self, request: web.Request) -> web.Response:
        body, problem = await self._receive(request, "ResourceClaim")
        if problem:
            return self._invalid(problem)
        body["metadata"]["namespace"] = request.match_info["namespace"]
        return _json(self.add_claim(body), 201)

    async def _get_claim(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        found = self.claims.get(key)
        if found is None:
            return _not_found("resourceclaims.resource.k8s.io", key[1])
        return _json(found)

    async def _list_nodes(self, request: web.Request) -> web.StreamResponse:
        wanted = _selector(request.query.get("fieldSelector", ""))
        for key in wanted:
            if key != "metadata.name":
                return _status(400, "BadRequest", f'field label not supported: "{key}"')
        if _watching(request):
            return await self._watch_nodes(request, wanted.get("metadata.name"))
        items = [n for name, n in self.nodes.items() if wanted.get("metadata.name", name) == name]
        version = str(next(self._versions))
        return _json(
            {
                "apiVersion": "v1",
                "kind": "NodeList",
                "metadata": {"resourceVersion": version},
                "items": items,
            }
        )

    async def _watch_nodes(self, request: web.Request, name: str | None) -> web.StreamResponse:
        """The Node's changes after the given resourceVersion (the newest of each Node missed)."""
        since = int(request.query.get("resourceVersion") or 0)
        missed = [
            {"type": "MODIFIED", "object": node}
            for node in self.nodes.values()
            if _version(node) > since
        ]
        return await self._stream(
            request, "nodes", missed, lambda node: name is None or node["metadata"]["name"] == name
        )

    async def _expired(self, request: web.Request, since: int) -> web.StreamResponse:
        """A watch from a compacted resourceVersion: one ERROR event, as the API server sends."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        status = _status_body(410, "Expired", f"too old resource version: {since}")
        await response.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        await response.write_eof()
        return response

    async def _stream(
        self,
        request: web.Request,
        resource: str,
        missed: list[JsonObject],
        selected: Callable[[JsonObject], bool],
    ) -> web.StreamResponse:
        """A watch: the `missed` events, then each change as it happens, of the objects
        `selected`, until `timeoutSeconds` or `end_watches`."""
        watch = _Watch(resource, asyncio.Queue())
        for change in missed:
            watch.queue.put_nowait(change)
        self._watches.append(watch)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        with contextlib.suppress(ConnectionResetError):  # the client went away
            try:
                async with asyncio.timeout(timeout):
                    while (event := await watch.queue.get()) is not None:
                        if event["type"] == "BOOKMARK" or selected(event["object"]):
                            await response.write(json.dumps(event).encode() + b"\n")
            except TimeoutError:
                pass
            finally:
                if watch in self._watches:
                    self._watches.remove(watch)
            await response.write_eof()
        return response

    async def _version(self, request: web.Request) -> web.Response:
        return _json(self.version)

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        found = self.nodes.get(name)
        return _json(found) if found is not None else _not_found("nodes", name)

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.nodes:
            return _not_found("nodes", name)
        if request.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", f"{request.content_type} not handled here")
        try:
            patch = json.loads(await request.read())
        except ValueError as err:
            return _status(400, "BadRequest", f"body is not JSON: {err}")
        if set(patch) - {"metadata"} or set(patch.get("metadata") or {}) - {"labels"}:
            return _status(400, "BadRequest", "this stand-in patches metadata.labels only")
        changes = patch["metadata"]["labels"]
        for key, value in changes.items():
            problem = _label_problem(key, value)
            if problem:
                return self._invalid(f"metadata.labels: {problem}")
        self._set_labels(name, changes)
        return _json(self.nodes[name])

    async def _create_event(self, request: web.Request) -> web.Response:
        body, problem = await self._receive_core(request, "Event")
        if problem:
            return self._invalid(problem)
        meta = body["metadata"]
        if (
            meta.get("namespace", request.match_info["namespace"])
            != request.match_info["namespace"]
        ):
            return _status(400, "BadRequest", "the namespace of the object does not match")
        meta["namespace"] = request.match_info["namespace"]
        if not meta.get("name"):
            meta["name"] = meta.get("generateName", "") + uuid.uuid4().hex[:5]
        stored = self._stamp(body)
        self.events.append(stored)
        return _json(stored, 201)

    async def _nfd_group(self, request: web.Request) -> web.Response:
        return _json(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "nfd.k8s-sigs.io/v1alpha1",
                "resources": [{"name": "nodefeatures", "namespaced": True, "kind": "NodeFeature"}],
            }
        )

    async def _get_node_feature(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        found = self.node_features.get(key)
        return _json(found) if found is not None else _not_found("nodefeatures", key[1])

    async def _create_node_feature(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        key = (request.match_info["namespace"], body["metadata"]["name"])
        if key in self.node_features:
            return _status(409, "AlreadyExists", f'nodefeatures "{key[1]}" already exists')
        problem = _node_feature_problem(body)
        if problem:
            return self._invalid(problem)
        self.node_features[key] = self._stamp(body)
        return _json(self.node_features[key], 201)

    async def _replace_node_feature(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        key = (request.match_info["namespace"], request.match_info["name"])
        current = self.node_features.get(key)
        if current is None:
            return _not_found("nodefeatures", key[1])
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return _status(
                409, "Conflict", f'nodefeatures "{key[1]}": the object has been modified'
            )
        problem = _node_feature_problem(body)
        if problem:
            return self._invalid(problem)
        self.node_features[key] = self._stamp(body, current["metadata"])
        return _json(self.node_features[key])

    async def _receive_core(self, request: web.Request, kind: str) -> tuple[JsonObject, str]:
        """A core/v1 object, validated against its OpenAPI schema."""
        try:
            body = json.loads(await request.read())
        except ValueError as err:
            return {}, f"body is not JSON: {err}"
        if not isinstance(body, dict) or body.get("apiVersion") != "v1" or body.get("kind") != kind:
            return {}, f"expected apiVersion v1, kind {kind}"
        try:
            kubernetes_validate.validate(body, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            return body, f"{'.'.join(str(p) for p in err.path)}: {err.message}"
        return body, ""

    async def _receive(self, request: web.Request, kind: str) -> tuple[JsonObject, str]:
        decoder = self._decoders.get(request.content_type)
        try:
            body = (decoder or json.loads)(await request.read())
        except ValueError as err:
            return {}, f"body is not {request.content_type if decoder else 'JSON'}: {err}"
        if not isinstance(body, dict):
            return {}, "body is not an object"
        problem = _schema_problem(body, kind, self._openapi)
        if not problem and kind == "ResourceSlice":
            problem = _slice_problem(body)
        return body, problem

    def _invalid(self, problem: str) -> web.Response:
        self.rejected.append(problem)
        return _status(422, "Invalid", problem)

    def _stamp(self, body: JsonObject, previous: JsonObject | None = None) -> JsonObject:
        stored: JsonObject = json.loads(json.dumps(body))
        meta = stored.setdefault("metadata", {})
        meta["uid"] = previous["uid"] if previous else str(uuid.uuid4())
        meta["creationTimestamp"] = (
            previous["creationTimestamp"]
            if previous
            else datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        meta["resourceVersion"] = str(next(self._versions))
        return stored


def _schema_problem(body: JsonObject, kind: str, openapi: bool = True) -> str:
    """Why `body` is not a valid v1 `kind`, or ""; `openapi`: against its OpenAPI schema too."""
    if body.get("apiVersion") != "resource.k8s.io/v1" or body.get("kind") != kind:
        return f"expected apiVersion resource.k8s.io/v1, kind {kind}"
    try:
        if openapi:
            kubernetes_validate.validate(body, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = ".".join(str(part) for part in err.path)
        return f"{where}: {err.message}"
    if not (body.get("metadata") or {}).get("name") and kind != "ResourceSlice":
        return "metadata.name: Required value"
    return ""


def drop_gated(body: JsonObject, gates_off: Collection[str]) -> None:
    """Remove from a ResourceSlice the fields of the feature gates in `gates_off`, as the API
    server's strategy does before it stores a new object: the write succeeds, the fields are
    gone."""
    spec = body.get("spec") or {}
    if PARTITIONABLE_DEVICES in gates_off:
        spec.pop("sharedCounters", None)
    for device in spec.get("devices") or []:
        if PARTITIONABLE_DEVICES in gates_off:
            device.pop("consumesCounters", None)
        if DEVICE_TAINTS in gates_off:
            device.pop("taints", None)
        if CONSUMABLE_CAPACITY in gates_off:
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)


def _slice_problem(body: JsonObject) -> str:
    """The ResourceSlice rules the OpenAPI schema does not carry, or ""."""
    meta, spec = body.get("metadata") or {}, body["spec"]
    if not meta.get("name") and not meta.get("generateName"):
        return "metadata.name: Required value: name or generateName is required"
    pool = spec["pool"]
    if pool["resourceSliceCount"] <= 0 or pool["generation"] < 0:
        return "spec.pool: resourceSliceCount must be > 0 and generation >= 0"
    chosen = [
        k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)
    ]
    if len(chosen) != 1:
        return f"spec: exactly one node selection field must be set, got {chosen}"
    if "sharedCounters" in spec and "devices" in spec:
        return "spec: Invalid value: only one of `sharedCounters` or `devices` is allowed"
    devices = spec.get("devices") or []
    limited = any(device.get("taints") or device.get("consumesCounters") for device in devices)
    limit = MAX_DEVICES_WITH_TAINTS if limited else MAX_DEVICES
    if len(devices) > limit:
        return f"spec.devices: Too many: {len(devices)}: must have at most {limit} items"
    names: set[str] = set()
    for n, device in enumerate(devices):
        problem = _device_problem(device, names) or _consumption_problem(device)
        if problem:
            return f"spec.devices[{n}]{problem}"
    return _counter_sets_problem(spec.get("sharedCounters") or [])


def _counter_sets_problem(sets: list[JsonObject]) -> str:
    """The 1.37 rules for `spec.sharedCounters` (validateResourceSliceSpec), or ""."""
    if len(sets) > MAX_COUNTER_SETS:
        return f"spec.sharedCounters: Too many: {len(sets)}: must have at most {MAX_COUNTER_SETS}"
    names: set[str] = set()
    for n, counter_set in enumerate(sets):
        name = counter_set.get("name", "")
        if not _DNS_LABEL.fullmatch(name) or name in names:
            return f"spec.sharedCounters[{n}].name: Invalid value: {name!r}"
        names.add(name)
        problem = _counters_problem(counter_set.get("counters") or {})
        if problem:
            return f"spec.sharedCounters[{n}].counters{problem}"
    return ""


def _consumption_problem(device: JsonObject) -> str:
    """The rules for a device's `consumesCounters` (validateDeviceCounterConsumption), or ""."""
    consumed = device.get("consumesCounters") or []
    if len(consumed) > MAX_COUNTER_CONSUMPTIONS:
        return f".consumesCounters: Too many: must have at most {MAX_COUNTER_CONSUMPTIONS} items"
    seen: set[str] = set()
    for n, consumption in enumerate(consumed):
        name = consumption.get("counterSet", "")
        if not _DNS_LABEL.fullmatch(name) or name in seen:
            return f".consumesCounters[{n}].counterSet: Invalid value: {name!r}"
        seen.add(name)
        problem = _counters_problem(consumption.get("counters") or {})
        if problem:
            return f".consumesCounters[{n}].counters{problem}"
    return ""


def _counters_problem(counters: JsonObject) -> str:
    if not counters:
        return ": Required value"
    if len(counters) > MAX_COUNTERS:
        return f": Too many: {len(counters)}: must have at most {MAX_COUNTERS}"
    for key in counters:
        if not _DNS_LABEL.fullmatch(key):
            return f"[{key}]: Invalid value: not a DNS label"
    return ""


def _device_problem(device: JsonObject, names: set[str]) -> str:
    name = device["name"]
    if not _DNS_LABEL.fullmatch(name) or name in names:
        return f".name: Invalid value: {name!r}: not a DNS label or not unique"
    names.add(name)
    attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        return (
            f": Too many: attributes and capacities must be at most {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key in [*attributes, *capacity]:
        domain, slash, _ = key.rpartition("/")
        if not _QUALIFIED.fullmatch(key) or (slash and len(domain) > 63):
            return f"[{key}]: Invalid value: not a qualified name"
    for key, value in attributes.items():
        set_fields = [k for k in ("string", "int", "bool", "version") if k in value]
        if len(set_fields) != 1:
            return f".attributes[{key}]: exactly one value must be specified"
        text = value.get("string", value.get("version"))
        if isinstance(text, str) and len(text) > MAX_ATTRIBUTE_VALUE:
            return f".attributes[{key}]: Too long: must have at most {MAX_ATTRIBUTE_VALUE} bytes"
        if "version" in value and not _SEMVER.fullmatch(value["version"]):
            return f".attributes[{key}].version: Invalid value: must be semantic version 2.0.0"
    if len(device.get("taints") or []) > MAX_TAINTS:
        return f".taints: Too many: must have at most {MAX_TAINTS} items"
    return ""


def _label_problem(key: str, value: object) -> str:
    """Why `key: value` is not a valid label (None removes it), or ""."""
    prefix, slash, name = key.rpartition("/")
    if (slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix))) or not (
        _LABEL_NAME.fullmatch(name)
    ):
        return f"Invalid value: {key!r}: not a qualified name"
    if value is not None and (not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value)):
        return f"Invalid value: {value!r}: at most 63 characters, alphanumeric at both ends"
    return ""


def _node_feature_problem(body: JsonObject) -> str:
    meta = body.get("metadata") or {}
    if body.get("kind") != "NodeFeature" or not meta.get("name"):
        return "expected a named NodeFeature"
    if not (meta.get("labels") or {}).get("nfd.node.kubernetes.io/node-name"):
        return "metadata.labels: nfd.node.kubernetes.io/node-name is required"
    for key, value in ((body.get("spec") or {}).get("labels") or {}).items():
        problem = _label_problem(key, value)
        if problem:
            return f"spec.labels: {problem}"
    return ""


def _watching(request: web.Request) -> bool:
    """`watch` as the API server parses it (Go's strconv.ParseBool): "True" from the Python
    client counts as much as "1" or "true"."""
    return _flag(request, "watch")


def _flag(request: web.Request, name: str) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it."""
    return request.query.get(name, "") in ("1", "t", "T", "true", "TRUE", "True")


def _version(item: JsonObject) -> int:
    return int(item["metadata"]["resourceVersion"])


def _selector(text: str) -> dict[str, str]:
    """`a=b,c==d` as {a: b, c: d}; only equality terms (what the driver sends)."""
    terms: dict[str, str] = {}
    for term in filter(None, text.split(",")):
        key, _, value = term.replace("==", "=").partition("=")
        terms[key.strip()] = value.strip()
    return terms


def _json(body: JsonObject, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _status(code: int, reason: str, message: str) -> web.Response:
    return _json(_status_body(code, reason, message), code)


def _status_body(code: int, reason: str, message: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _not_found(resource: str, name: str) -> web.Response:
    return _status(404, "NotFound", f'{resource} "{name}" not found')
