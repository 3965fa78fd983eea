"""A stand-in for the Kubernetes API server's `resource.k8s.io/v1` endpoints, on 127.0.0.1.

It serves what the DRA driver and its tests use: ResourceSlices (list with `fieldSelector` and
`labelSelector` equality terms, create, replace, delete, and delete-collection, with which the
kubelet wipes a node's slices) and ResourceClaims (get by namespace/name; create, so tests and
the demo can seed claims). Like a real API server it

- validates every object it receives against the `resource.k8s.io/v1` OpenAPI schema
  (kubernetes-validate, strict, Kubernetes 1.34: the first release serving v1) and against the
  limits the schema cannot express (ResourceSlice validation in Kubernetes' `types.go`), and
  refuses an invalid one with `422 Invalid`;
- assigns `uid`, `resourceVersion` and `creationTimestamp`, answers `409 AlreadyExists` for a
  second create and `409 Conflict` for a replace whose `resourceVersion` is stale.

`fail_next(status, count)` makes the next requests fail, and `requests` records every call, so
tests can check retries and that an unchanged publish writes nothing.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
from aiohttp import web

JsonObject = dict[str, Any]

SCHEMA_VERSION = "1.34"
PREFIX = "/apis/resource.k8s.io/v1"
# The API server's own ResourceSlice limits (k8s.io/api resource/v1 types.go).
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64
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


class ApiServer:
    """Start with `await start()`; `url` is then `http://127.0.0.1:<port>`."""

    def __init__(self) -> None:
        self.slices: dict[str, JsonObject] = {}
        self.claims: dict[tuple[str, str], JsonObject] = {}
        self.requests: list[tuple[str, str]] = []
        self.rejected: list[str] = []  # why each 422 was answered
        self._versions = itertools.count(1)
        self._failures: list[int] = []
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
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def fail_next(self, status: int, count: int = 1) -> None:
        """Answer the next `count` requests with `status` (a Status body, nothing stored)."""
        self._failures.extend([status] * count)

    def add_claim(self, claim: JsonObject) -> JsonObject:
        """Store a ResourceClaim as a create would (validated; raises ValueError if invalid)."""
        problem = _schema_problem(claim, "ResourceClaim")
        if problem:
            raise ValueError(problem)
        stored = self._stamp(claim)
        meta = stored["metadata"]
        self.claims[(meta.get("namespace", "default"), meta["name"])] = stored
        return stored

    # --- request handling -----------------------------------------------------------------------

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if self._failures:
            code = self._failures.pop(0)
            return _status(code, "InternalError", f"injected failure {code}")
        response: web.StreamResponse = await handler(request)
        return response

    async def _list_slices(self, request: web.Request) -> web.Response:
        wanted = _selector(request.query.get("fieldSelector", ""))
        labels = _selector(request.query.get("labelSelector", ""))
        for key in wanted:
            if key not in _SLICE_FIELDS:
                return _status(400, "BadRequest", f'field label not supported: "{key}"')
        items = [
            item
            for item in self.slices.values()
            if all(_SLICE_FIELDS[k](item) == v for k, v in wanted.items())
            and all((item["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())
        ]
        return _json(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSliceList",
                "metadata": {"resourceVersion": str(next(self._versions))},
                "items": items,
            }
        )

    async def _create_slice(self, request: web.Request) -> web.Response:
        body, problem = await self._receive(request, "ResourceSlice")
        if problem:
            return self._invalid(problem)
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if meta["name"] in self.slices:
            return _status(409, "AlreadyExists", f'resourceslices "{meta["name"]}" already exists')
        stored = self._stamp(body)
        self.slices[meta["name"]] = stored
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
        stored = self._stamp(body, current["metadata"])
        self.slices[name] = stored
        return _json(stored)

    async def _delete_slice(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        found = self.slices.pop(name, None)
        if found is None:
            return _not_found("resourceslices", name)
        return _json(found)

    async def _delete_slices(self, request: web.Request) -> web.Response:
        wanted = _selector(request.query.get("fieldSelector", ""))
        for key in wanted:
            if key not in _SLICE_FIELDS:
                return _status(400, "BadRequest", f'field label not supported: "{key}"')
        for name, item in list(self.slices.items()):
            if all(_SLICE_FIELDS[k](item) == v for k, v in wanted.items()):
                del self.slices[name]
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

    async def _receive(self, request: web.Request, kind: str) -> tuple[JsonObject, str]:
        try:
            body = json.loads(await request.read())
        except ValueError as err:
            return {}, f"body is not JSON: {err}"
        if not isinstance(body, dict):
            return {}, "body is not an object"
        problem = _schema_problem(body, kind)
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


def _schema_problem(body: JsonObject, kind: str) -> str:
    """Why `body` is not a valid v1 `kind`, or ""."""
    if body.get("apiVersion") != "resource.k8s.io/v1" or body.get("kind") != kind:
        return f"expected apiVersion resource.k8s.io/v1, kind {kind}"
    try:
        kubernetes_validate.validate(body, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = ".".join(str(part) for part in err.path)
        return f"{where}: {err.message}"
    if not (body.get("metadata") or {}).get("name") and kind != "ResourceSlice":
        return "metadata.name: Required value"
    return ""


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
    devices = spec.get("devices") or []
    tainted = any(device.get("taints") for device in devices)
    limit = MAX_DEVICES_WITH_TAINTS if tainted else MAX_DEVICES
    if len(devices) > limit:
        return f"spec.devices: Too many: {len(devices)}: must have at most {limit} items"
    names: set[str] = set()
    for n, device in enumerate(devices):
        problem = _device_problem(device, names)
        if problem:
            return f"spec.devices[{n}]{problem}"
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
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return _json(body, code)


def _not_found(resource: str, name: str) -> web.Response:
    return _status(404, "NotFound", f'{resource} "{name}" not found')
