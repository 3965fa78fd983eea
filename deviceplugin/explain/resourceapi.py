"""DeviceClasses, ResourceClaims and ResourceClaimTemplates read as the API server takes them.

`read_classes` and `read_claims` accept the parsed YAML of every version Kubernetes 1.37
serves (`resource.k8s.io/v1`, `v1beta2`, `v1beta1`) and check it as the API server would
before anything is simulated: field names (strictly, as `kubectl apply` asks), types, required
fields, names (DNS labels and subdomains, qualified attribute names, label keys and values),
list limits, unique request names, constraints and configs that name existing requests, and
CEL that compiles. Then they apply the server's defaults (`allocationMode: ExactCount`, `count:
1`, a toleration's `operator: Equal`) and convert to v1 as the server does: a v1beta1 request's
inline fields become its `exactly` (v1beta2 already has the v1 shape). The result is frozen
values for `dra.claims`; every problem is reported with its field path, in the terms of the
document's own version, and nothing but ConfigError ever leaves.

What a claim holds that the simulation leaves out, or that the server would quietly default, is
kept as a note on the claim (`count: 0`, `derivedAttributes`, the namespace label
`adminAccess` needs), so a report can name it. A request's consumable `capacity.requests` are
read as whole quantities (bytes), keyed by the capacity's name as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import field
from typing import Any, TypeVar

from deviceplugin.explain.selectors import Selector, SelectorError
from deviceplugin.model.config_keys import describe
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.kubenames import (
    dns_label_problem,
    dns_subdomain_problem,
    is_extended_resource_name,
)
from deviceplugin.model.quantity import parse_quantity
from deviceplugin.model.record import record

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")

# Limits of resource.k8s.io/v1 (k8s.io/api resource/v1 types.go).
MAX_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_SUBREQUESTS = 8  # FirstAvailableDeviceRequestMaxSize
MAX_SELECTORS = 32  # DeviceSelectorsMaxSize
MAX_CONSTRAINTS = 32  # DeviceConstraintsMaxSize
MAX_CONFIGS = 32  # DeviceConfigMaxSize
MAX_TOLERATIONS = 16  # DeviceTolerationsMaxLength
MAX_EXPRESSION = 10 * 1024  # CELSelectorExpressionMaxLength
MAX_PARAMETERS = 10 * 1024  # OpaqueParametersMaxLength
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DRIVER_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TOP = ("apiVersion", "kind", "metadata", "spec", "status")
_DEVICES = ("requests", "constraints", "config")
_EXACT = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
    "derivedAttributes",
)
_SUBREQUEST = ("name", *(f for f in _EXACT if f != "adminAccess"))
_V1_REQUEST = ("name", "exactly", "firstAvailable")
_V1BETA1_REQUEST = ("name", *_EXACT, "firstAvailable")
_SCALARS = ("deviceClassName", "allocationMode", "count")
_TOLERATION = ("key", "operator", "value", "effect", "tolerationSeconds")
_CONSTRAINT = ("requests", "matchAttribute", "distinctAttribute")
_INLINE_IN_V1BETA1 = (
    " (inline request fields are the resource.k8s.io/v1beta1 shape: in v1 and v1beta2 they go"
    " under `exactly`)"
)
_HINTS: Mapping[str, Mapping[str, str]] = {
    "v1": {field: _INLINE_IN_V1BETA1 for field in _EXACT},
    "v1beta2": {field: _INLINE_IN_V1BETA1 for field in _EXACT},
    "v1beta1": {"exactly": " (resource.k8s.io/v1beta1 has the request's fields inline)"},
}

Problems = list[tuple[str, str]]
T = TypeVar("T")


@record(frozen=True)
class Toleration:
    """A request's toleration of device taints, defaulted (`operator` Equal)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Mapping[str, Any]) -> bool:
        """As Kubernetes' resourceclaim.ToleratesTaint."""
        if self.effect and self.effect != taint.get("effect"):
            return False
        if self.key and self.key != taint.get("key"):
            return False
        if self.operator == "Exists":
            return True
        return self.operator == "Equal" and self.value == taint.get("value", "")


@record(frozen=True)
class DeviceChoice:
    """What one `exactly` request, or one `firstAvailable` subrequest, asks for."""

    name: str  # the request's name, or `<request>/<subrequest>`
    device_class: str
    selectors: tuple[Selector, ...] = ()
    count: int | None = 1  # None: allocationMode All
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()
    capacity: Mapping[str, int] = field(default_factory=dict)  # capacity.requests


@record(frozen=True)
class Request:
    """One device request: `choices` holds the `exactly` request, or the subrequests of
    `firstAvailable` in the order the scheduler tries them."""

    name: str
    choices: tuple[DeviceChoice, ...]
    first_available: bool = False


@record(frozen=True)
class Constraint:
    """`matchAttribute` (or with `distinct`, `distinctAttribute`) over the named requests or
    subrequests; no names: every request of the claim."""

    attribute: str
    requests: tuple[str, ...] = ()
    distinct: bool = False


@record(frozen=True)
class Claim:
    kind: str
    api_version: str
    name: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...] = ()
    notes: tuple[str, ...] = ()


@record(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[Selector, ...] = ()
    extended_resource_name: str | None = None


def read_classes(documents: Sequence[object], source: str) -> dict[str, DeviceClass]:
    """Every DeviceClass of `documents` by name; other kinds are skipped. ConfigError for an
    invalid one, or when there is none."""
    classes: dict[str, DeviceClass] = {}
    for position, document in _objects(documents, source, ("DeviceClass",)):
        device_class = _checked(document, source, position, _device_class)
        if device_class.name in classes:
            where = _where(source, position, document)
            raise ConfigError(where, f"DeviceClass {device_class.name} is defined twice")
        classes[device_class.name] = device_class
    if not classes:
        raise ConfigError(source, "holds no DeviceClass")
    return classes


def read_claims(documents: Sequence[object], source: str) -> list[Claim]:
    """Every ResourceClaim and ResourceClaimTemplate of `documents`, in order; other kinds
    (a Pod next to its template) are skipped. ConfigError for an invalid one, or when there is
    none."""
    claims = [
        _checked(document, source, position, _claim)
        for position, document in _objects(documents, source, CLAIM_KINDS)
    ]
    if not claims:
        raise ConfigError(source, "holds no ResourceClaim or ResourceClaimTemplate")
    return claims


# --- documents ----------------------------------------------------------------------------------


def _objects(
    documents: Sequence[object], source: str, kinds: Collection[str]
) -> Iterator[tuple[int, dict[Any, Any]]]:
    """(position, document) of each document of one of `kinds`."""
    for position, document in enumerate(documents):
        if not isinstance(document, dict):
            raise ConfigError(
                f"{source}, document {position + 1}",
                f"must be a Kubernetes object (a mapping), got {describe(document)}",
            )
        if document.get("kind") in kinds:
            yield position, document


def _where(source: str, position: int, document: Mapping[Any, Any]) -> str:
    metadata = document.get("metadata")
    name = metadata if isinstance(metadata, dict) else {}
    label = f"{document.get('kind')} {name.get('name')}" if name.get("name") else document["kind"]
    return f"{source}, document {position + 1} ({label})"


def _checked(
    document: dict[Any, Any],
    source: str,
    position: int,
    read: Callable[[dict[Any, Any], str, Problems], T],
) -> T:
    api_version = document.get("apiVersion")
    version = ""
    if isinstance(api_version, str) and api_version.startswith(f"{GROUP}/"):
        version = api_version.removeprefix(f"{GROUP}/")
    if version not in VERSIONS:
        served = ", ".join(f"{GROUP}/{v}" for v in VERSIONS)
        problem = ("apiVersion", f"must be one of {served}, got {describe(api_version)}")
        raise _combined(_where(source, position, document), [problem])
    problems: Problems = []
    _mapping(document, "", problems, _TOP)
    result = read(document, version, problems)
    if problems:
        raise _combined(_where(source, position, document), problems)
    return result


def _combined(where: str, problems: Problems) -> ConfigError:
    """The first problem with its path, the others summed up after it."""
    (path, message), rest = problems[0], problems[1:]
    if rest:
        listed = "; ".join(f"{p or '(top)'}: {m}" for p, m in rest[:4])
        more = f"; and {len(rest) - 4} more" if len(rest) > 4 else ""
        message += f" (and {len(rest)} more: {listed}{more})"
    return ConfigError(f"{where}: {path or '(top)'}", message)


def _object_name(document: Mapping[Any, Any], problems: Problems) -> str:
    metadata = _mapping(document.get("metadata"), "metadata", problems, None)
    name = _string(metadata, "name", "metadata", problems)
    generated = _string(metadata, "generateName", "metadata", problems)
    if not name and not generated:
        problems.append(("metadata.name", "required"))
    elif name:
        _check_subdomain(name, "metadata.name", problems)
    return name or generated


# --- DeviceClass --------------------------------------------------------------------------------


def _device_class(document: dict[Any, Any], version: str, problems: Problems) -> DeviceClass:
    name = _object_name(document, problems)
    spec = _mapping(
        document.get("spec"), "spec", problems, ("selectors", "config", "extendedResourceName")
    )
    selectors = _selectors(spec, "spec", problems)
    _configs(spec, "spec", problems, None)
    extended = _string(spec, "extendedResourceName", "spec", problems)
    if isinstance(spec.get("extendedResourceName"), str) and not is_extended_resource_name(
        extended
    ):
        problems.append(
            (
                "spec.extendedResourceName",
                f"must be a valid extended resource name (domain/name, not in kubernetes.io),"
                f" got '{extended}'",
            )
        )
    return DeviceClass(name, selectors, extended or None)


# --- ResourceClaim, ResourceClaimTemplate -------------------------------------------------------


def _claim(document: dict[Any, Any], version: str, problems: Problems) -> Claim:
    kind = document["kind"]
    name = _object_name(document, problems)
    spec = _mapping(
        document.get("spec"),
        "spec",
        problems,
        ("devices",) if kind == "ResourceClaim" else ("metadata", "spec"),
    )
    path = "spec"
    if kind == "ResourceClaimTemplate":
        _mapping(spec.get("metadata"), "spec.metadata", problems, None)
        path = "spec.spec"
        if spec.get("spec") is None:
            problems.append((path, "required"))
        spec = _mapping(spec.get("spec"), path, problems, ("devices",))
    notes: list[str] = []
    devices_path = f"{path}.devices"
    devices = _mapping(spec.get("devices"), devices_path, problems, _DEVICES)
    requests = _requests(devices, devices_path, version, problems, notes)
    names = _request_names(requests)
    constraints = _constraints(devices, devices_path, problems, names)
    _configs(devices, devices_path, problems, names)
    return Claim(kind, f"{GROUP}/{version}", name, requests, constraints, tuple(notes))


def _requests(
    devices: Mapping[str, Any], path: str, version: str, problems: Problems, notes: list[str]
) -> tuple[Request, ...]:
    requests: list[Request] = []
    seen: set[str] = set()
    for position, entry in enumerate(_list(devices, "requests", path, problems, MAX_REQUESTS)):
        at = f"{path}.requests[{position}]"
        fields = _V1BETA1_REQUEST if version == "v1beta1" else _V1_REQUEST
        request = _mapping(entry, at, problems, fields, _HINTS[version])
        name = _string(request, "name", at, problems)
        _check_label(name, f"{at}.name", problems)
        if name and name in seen:
            problems.append((f"{at}.name", f"duplicate request name '{name}'"))
        seen.add(name)
        read = _request_v1beta1 if version == "v1beta1" else _request_v1
        requests.append(read(request, at, name, problems, notes))
    return tuple(requests)


def _request_v1(
    request: Mapping[str, Any], at: str, name: str, problems: Problems, notes: list[str]
) -> Request:
    exactly = request.get("exactly")
    first = _list(request, "firstAvailable", at, problems, MAX_SUBREQUESTS)
    if exactly is None and not first:
        problems.append((at, "exactly one of `exactly` or `firstAvailable` is required"))
    elif exactly is not None and first:
        problems.append((at, "exactly one of `exactly` or `firstAvailable`, not both"))
    elif exactly is not None:
        fields = _mapping(exactly, f"{at}.exactly", problems, _EXACT)
        return Request(name, (_choice(fields, f"{at}.exactly", name, problems, notes),))
    return Request(name, _subrequests(first, at, name, problems, notes), first_available=True)


def _request_v1beta1(
    request: Mapping[str, Any], at: str, name: str, problems: Problems, notes: list[str]
) -> Request:
    """v1beta1 has the request's fields inline; any of them set means an `exactly` in v1
    (conversion.go's hasAnyMainRequestFieldsSet: empty strings and a zero count are unset)."""
    inline = any(_is_set(request.get(field), field in _SCALARS) for field in _EXACT)
    first = _list(request, "firstAvailable", at, problems, MAX_SUBREQUESTS)
    if not inline and not first:
        problems.append((at, "exactly one of `deviceClassName` or `firstAvailable` is required"))
    elif inline and first:
        problems.append((at, "`firstAvailable` cannot be combined with `deviceClassName`"))
    elif inline:
        return Request(name, (_choice(request, at, name, problems, notes),))
    return Request(name, _subrequests(first, at, name, problems, notes), first_available=True)


def _is_set(value: object, scalar: bool) -> bool:
    """Set as Go sees a decoded field: a scalar's zero value ("", 0) is unset, as is null."""
    if scalar and not isinstance(value, bool):
        return value not in (None, "", 0)
    return value is not None


def _subrequests(
    entries: Sequence[Any], at: str, parent: str, problems: Problems, notes: list[str]
) -> tuple[DeviceChoice, ...]:
    choices: list[DeviceChoice] = []
    seen: set[str] = set()
    for position, entry in enumerate(entries):
        sub_at = f"{at}.firstAvailable[{position}]"
        fields = _mapping(entry, sub_at, problems, _SUBREQUEST)
        name = _string(fields, "name", sub_at, problems)
        _check_label(name, f"{sub_at}.name", problems)
        if name and name in seen:
            problems.append((f"{sub_at}.name", f"duplicate subrequest name '{name}'"))
        seen.add(name)
        choices.append(_choice(fields, sub_at, f"{parent}/{name}", problems, notes))
    return tuple(choices)


def _choice(
    fields: Mapping[str, Any], at: str, name: str, problems: Problems, notes: list[str]
) -> DeviceChoice:
    """An `exactly` request or a subrequest, defaulted as the API server does."""
    device_class = _string(fields, "deviceClassName", at, problems)
    if not device_class:
        problems.append((f"{at}.deviceClassName", "required"))
    else:
        _check_subdomain(device_class, f"{at}.deviceClassName", problems)
    selectors = _selectors(fields, at, problems)
    mode = _string(fields, "allocationMode", at, problems) or "ExactCount"
    count = _integer(fields, "count", at, problems)
    if mode not in ("ExactCount", "All"):
        problems.append(
            (f"{at}.allocationMode", f"must be ExactCount or All, got {describe(mode)}")
        )
    elif mode == "All" and count:
        problems.append((f"{at}.count", "must not be specified when allocationMode is 'All'"))
    elif mode == "ExactCount" and count is not None and count < 0:
        problems.append((f"{at}.count", f"must be greater than zero, got {count}"))
    elif mode == "ExactCount" and count == 0:
        notes.append(f"{at}.count: 0 is the same as unset, so the API server defaults it to 1")
    admin = _boolean(fields, "adminAccess", at, problems)
    if admin:
        notes.append(
            f"{at}.adminAccess: the API server accepts it only in a namespace labelled"
            f" {ADMIN_NAMESPACE_LABEL}=true (not checked here)"
        )
    tolerations = _tolerations(fields, at, problems)
    capacity = _capacity(fields, at, problems)
    if fields.get("derivedAttributes") is not None:
        _list(fields, "derivedAttributes", at, problems, 32)
        notes.append(
            f"{at}.derivedAttributes: not simulated (alpha in 1.37, DRADerivedAttributes off by"
            " default)"
        )
    return DeviceChoice(
        name=name,
        device_class=device_class,
        selectors=selectors,
        count=None if mode == "All" else (count or 1),
        admin_access=bool(admin),
        tolerations=tolerations,
        capacity=capacity,
    )


def _capacity(fields: Mapping[str, Any], at: str, problems: Problems) -> dict[str, int]:
    """`capacity.requests`: capacity name -> quantity, as whole numbers rounded up."""
    capacity = _mapping(fields.get("capacity"), f"{at}.capacity", problems, ("requests",))
    path = f"{at}.capacity.requests"
    requests = _mapping(capacity.get("requests"), path, problems, None)
    amounts = {}
    for name, value in requests.items():
        where = f"{path}[{name}]"
        _check_capacity_name(name, where, problems)
        try:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ValueError(value)
            amounts[name] = parse_quantity(str(value))
        except ValueError:
            problems.append((where, f"must be a quantity (20Gi), got {describe(value)}"))
    return amounts


def _tolerations(fields: Mapping[str, Any], at: str, problems: Problems) -> tuple[Toleration, ...]:
    tolerations = []
    for position, entry in enumerate(_list(fields, "tolerations", at, problems, MAX_TOLERATIONS)):
        path = f"{at}.tolerations[{position}]"
        toleration = _mapping(entry, path, problems, _TOLERATION)
        key = _string(toleration, "key", path, problems)
        if key:
            _check_label_key(key, f"{path}.key", problems)
        operator = _string(toleration, "operator", path, problems) or "Equal"
        value = _string(toleration, "value", path, problems)
        if operator == "Exists" and value:
            problems.append((f"{path}.value", "must be empty for operator `Exists`"))
        elif operator == "Equal":
            _check_label_value(value, f"{path}.value", problems)
        elif operator != "Exists":
            problems.append((f"{path}.operator", f"must be Exists or Equal, got '{operator}'"))
        effect = _string(toleration, "effect", path, problems)
        if effect and effect not in TAINT_EFFECTS:
            problems.append(
                (f"{path}.effect", f"must be one of {', '.join(TAINT_EFFECTS)}, got '{effect}'")
            )
        _integer(toleration, "tolerationSeconds", path, problems)
        tolerations.append(Toleration(key, operator, value, effect))
    return tuple(tolerations)


def _request_names(requests: Sequence[Request]) -> dict[str, set[str]]:
    """Request name -> its subrequests' names, for checking references."""
    return {
        r.name: {c.name.partition("/")[2] for c in r.choices} if r.first_available else set()
        for r in requests
    }


def _references(
    fields: Mapping[str, Any], at: str, problems: Problems, names: Mapping[str, set[str]]
) -> tuple[str, ...]:
    """A constraint's or config's `requests`: each a request or `<request>/<subrequest>`."""
    found: list[str] = []
    for position, reference in enumerate(_list(fields, "requests", at, problems, MAX_REQUESTS)):
        path = f"{at}.requests[{position}]"
        if not isinstance(reference, str):
            problems.append((path, f"must be a string, got {describe(reference)}"))
            continue
        request, _, sub = reference.partition("/")
        known = request in names and (not sub or sub in names[request])
        if not known or reference.count("/") > 1:
            problems.append(
                (path, f"'{reference}' is not a request of this claim (nor request/subrequest)")
            )
        elif reference in found:
            problems.append((path, f"duplicate '{reference}'"))
        found.append(reference)
    return tuple(found)


def _constraints(
    devices: Mapping[str, Any], at: str, problems: Problems, names: Mapping[str, set[str]]
) -> tuple[Constraint, ...]:
    constraints = []
    for position, entry in enumerate(_list(devices, "constraints", at, problems, MAX_CONSTRAINTS)):
        path = f"{at}.constraints[{position}]"
        fields = _mapping(entry, path, problems, _CONSTRAINT)
        requests = _references(fields, path, problems, names)
        match = _string(fields, "matchAttribute", path, problems)
        distinct = _string(fields, "distinctAttribute", path, problems)
        if bool(match) == bool(distinct):
            problems.append(
                (path, "exactly one of `matchAttribute` or `distinctAttribute` is required")
            )
            continue
        field = "matchAttribute" if match else "distinctAttribute"
        _check_qualified_attribute(match or distinct, f"{path}.{field}", problems)
        constraints.append(Constraint(match or distinct, requests, distinct=bool(distinct)))
    return tuple(constraints)


def _configs(
    fields: Mapping[str, Any], at: str, problems: Problems, names: Mapping[str, set[str]] | None
) -> None:
    """`config` entries (opaque parameters for the driver): checked, not needed to allocate.
    `names` None: a DeviceClass's, which names no requests."""
    allowed = ("opaque",) if names is None else ("requests", "opaque")
    for position, entry in enumerate(_list(fields, "config", at, problems, MAX_CONFIGS)):
        path = f"{at}.config[{position}]"
        config = _mapping(entry, path, problems, allowed)
        if names is not None:
            _references(config, path, problems, names)
        if config.get("opaque") is None:
            problems.append((f"{path}.opaque", "required"))
            continue
        opaque = _mapping(config["opaque"], f"{path}.opaque", problems, ("driver", "parameters"))
        driver = _string(opaque, "driver", f"{path}.opaque", problems)
        if not driver:
            problems.append((f"{path}.opaque.driver", "required"))
        elif _DRIVER_NAME.fullmatch(driver) is None or len(driver) > 63:
            problems.append((f"{path}.opaque.driver", f"'{driver}' is not a driver name"))
        if opaque.get("parameters") is None:
            problems.append((f"{path}.opaque.parameters", "required"))
        elif (size := _json_size(opaque["parameters"], MAX_PARAMETERS)) > MAX_PARAMETERS:
            problems.append(
                (
                    f"{path}.opaque.parameters",
                    f"must have at most {MAX_PARAMETERS} bytes as JSON, has at least {size}",
                )
            )


def _json_size(value: object, limit: int) -> int:
    """Bytes of `value` as compact JSON, as a client sends it (the API server limits those),
    counted only until past `limit`: YAML aliases make a small file a huge, even endless,
    value. Walked without recursion, so any depth is measured."""
    size, todo = 0, [value]
    while todo and size <= limit:
        item = todo.pop()
        if isinstance(item, dict):
            size += 2 + 2 * len(item) - (1 if item else 0)  # braces, colons, commas
            size += sum(_scalar_size(str(key)) for key in item)
            todo.extend(item.values())
        elif isinstance(item, list):
            size += 2 + max(len(item) - 1, 0)
            todo.extend(item)
        else:
            size += _scalar_size(item)
    return size


def _scalar_size(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode())


def _selectors(fields: Mapping[str, Any], at: str, problems: Problems) -> tuple[Selector, ...]:
    selectors = []
    for position, entry in enumerate(_list(fields, "selectors", at, problems, MAX_SELECTORS)):
        path = f"{at}.selectors[{position}]"
        selector = _mapping(entry, path, problems, ("cel",))
        if selector.get("cel") is None:
            problems.append((f"{path}.cel", "required"))
            continue
        cel = _mapping(selector["cel"], f"{path}.cel", problems, ("expression",))
        expression = _string(cel, "expression", f"{path}.cel", problems)
        where = f"{path}.cel.expression"
        if not expression:
            problems.append((where, "required"))
        elif len(expression.encode()) > MAX_EXPRESSION:
            problems.append((where, f"must have at most {MAX_EXPRESSION} bytes"))
        else:
            try:
                selectors.append(Selector(expression, where))
            except SelectorError as err:
                problems.append((where, str(err)))
    return tuple(selectors)


# --- typed fields -------------------------------------------------------------------------------


def _mapping(
    value: object,
    path: str,
    problems: Problems,
    known: Collection[str] | None,
    hints: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`value` as a mapping (null: empty); with `known`, every other key is an unknown field."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append((path or "(top)", f"must be a mapping, got {describe(value)}"))
        return {}
    checked: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append((path or "(top)", f"field names must be strings, got {describe(key)}"))
        elif known is not None and key not in known:
            hint = (hints or {}).get(key, "")
            problems.append((_join(path, key), f"unknown field{hint}"))
        else:
            checked[key] = item
    return checked


def _typed(
    fields: Mapping[str, Any], key: str, path: str, problems: Problems, kind: type, what: str
) -> Any:
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        quoted = " (a quoted string)" if isinstance(value, str) else ""
        problems.append((_join(path, key), f"must be {what}, got {describe(value)}{quoted}"))
        return None
    return value


def _string(fields: Mapping[str, Any], key: str, path: str, problems: Problems) -> str:
    value: str | None = _typed(fields, key, path, problems, str, "a string")
    return value or ""


def _integer(fields: Mapping[str, Any], key: str, path: str, problems: Problems) -> int | None:
    value: int | None = _typed(fields, key, path, problems, int, "an integer")
    return value


def _boolean(fields: Mapping[str, Any], key: str, path: str, problems: Problems) -> bool | None:
    value: bool | None = _typed(fields, key, path, problems, bool, "true or false")
    return value


def _list(
    fields: Mapping[str, Any], key: str, path: str, problems: Problems, most: int
) -> list[Any]:
    value: list[Any] | None = _typed(fields, key, path, problems, list, "a list")
    if value is None:
        return []
    if len(value) > most:
        problems.append((_join(path, key), f"must have at most {most} items, has {len(value)}"))
        return value[:most]
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# --- name formats -------------------------------------------------------------------------------


def _check_label(name: str, path: str, problems: Problems) -> None:
    """A DNS label (request names): lower-case alphanumerics and '-', at most 63."""
    if not name:
        problems.append((path, "required"))
    elif dns_label_problem(name) is not None:
        problems.append(
            (path, f"'{name}' must be a DNS label: lower-case letters, digits and '-', at most 63")
        )


def _check_subdomain(name: str, path: str, problems: Problems) -> None:
    if dns_subdomain_problem(name) is not None:
        problems.append(
            (path, f"'{name}' must be a DNS subdomain: lower-case labels joined by '.'")
        )


def _check_qualified_attribute(name: str, path: str, problems: Problems) -> None:
    """A fully qualified attribute name: `<domain>/<C identifier>`."""
    domain, slash, identifier = name.partition("/")
    valid = (
        slash == "/"
        and len(domain) <= 63
        and _DRIVER_NAME.fullmatch(domain) is not None
        and len(identifier) <= 32
        and _C_IDENTIFIER.fullmatch(identifier) is not None
    )
    if not valid:
        problems.append(
            (
                path,
                f"'{name}' must be a domain and an attribute name joined by '/'"
                " (nvidia.com/parentUUID)",
            )
        )


def _check_capacity_name(name: str, path: str, problems: Problems) -> None:
    """A QualifiedName: a C identifier, or a domain and one joined by '/'."""
    domain, slash, identifier = name.rpartition("/")
    valid = (
        (not slash or (len(domain) <= 63 and _DRIVER_NAME.fullmatch(domain) is not None))
        and len(identifier) <= 32
        and _C_IDENTIFIER.fullmatch(identifier) is not None
    )
    if not valid:
        problems.append(
            (
                path,
                f"'{name}' must be a capacity name: a C identifier (memory), or a domain and"
                " one joined by '/' (gpu.nvidia.com/memory)",
            )
        )


def _check_label_key(key: str, path: str, problems: Problems) -> None:
    prefix, slash, name = key.rpartition("/")
    valid = (
        (not slash or dns_subdomain_problem(prefix) is None)
        and len(name) <= 63
        and _LABEL_NAME.fullmatch(name) is not None
    )
    if not valid:
        problems.append((path, f"'{key}' is not a label key"))


def _check_label_value(value: str, path: str, problems: Problems) -> None:
    if value and (len(value) > 63 or _LABEL_NAME.fullmatch(value) is None):
        problems.append((path, f"'{value}' is not a label value"))
