"""Which devices a DeviceClass selects and which a claim would get, as the scheduler decides.

`read_classes` and `read_claim` take parsed YAML (`resource.k8s.io/v1` DeviceClass, and
ResourceClaim or ResourceClaimTemplate); `select` evaluates one class on a set of devices and
`allocate` answers a claim: each request (`exactly`: class, extra selectors, `count` or
`allocationMode: All`) takes devices that every selector accepts, no device twice, and every
`matchAttribute` constraint makes the devices of the requests it names share one value of that
attribute (a device without the attribute cannot satisfy it). Values are tried in the order
their first devices appear and devices are taken in slice order, so the answer is
deterministic. A selector that fails on a device fails the claim, as it does in Kubernetes.
`firstAvailable` requests are not simulated.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.dra.selectors import Selector, SelectorError, qualified
from deviceplugin.model.errors import ConfigError

JsonObject = dict[str, Any]
MAX_COMBINATIONS = 100_000  # constraint values to try before giving up


@dataclass(frozen=True)
class Request:
    name: str
    device_class: str
    selectors: tuple[Selector, ...]
    count: int | None  # None: allocationMode All


@dataclass(frozen=True)
class Constraint:
    attribute: str
    requests: tuple[str, ...]  # empty: every request of the claim


@dataclass(frozen=True)
class Claim:
    name: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...] = ()


@dataclass(frozen=True)
class Allocation:
    """Devices per request, and the value each constraint settled on; `failure` says why not."""

    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    values: Mapping[str, object] = field(default_factory=dict)
    failure: str = ""


def read_classes(documents: Sequence[object]) -> dict[str, tuple[Selector, ...]]:
    """DeviceClass name -> its compiled selectors; other kinds are skipped."""
    classes: dict[str, tuple[Selector, ...]] = {}
    for position, document in enumerate(documents):
        if not isinstance(document, dict) or document.get("kind") != "DeviceClass":
            continue
        name = (document.get("metadata") or {}).get("name")
        if not name:
            raise ConfigError(f"class[{position}].metadata.name", "required")
        spec = document.get("spec") or {}
        classes[name] = _selectors(spec.get("selectors") or [], f"DeviceClass {name}")
    if not classes:
        raise ConfigError("class", "no DeviceClass found")
    return classes


def read_claim(document: object) -> Claim:
    """A ResourceClaim's or ResourceClaimTemplate's device requests and constraints."""
    if not isinstance(document, dict) or document.get("kind") not in (
        "ResourceClaim",
        "ResourceClaimTemplate",
    ):
        raise ConfigError("claim", "expected a ResourceClaim or ResourceClaimTemplate")
    spec = document.get("spec") or {}
    if document["kind"] == "ResourceClaimTemplate":
        spec = spec.get("spec") or {}
    devices = spec.get("devices") or {}
    requests = []
    for position, entry in enumerate(devices.get("requests") or []):
        path = f"spec.devices.requests[{position}]"
        exact = entry.get("exactly")
        if exact is None:
            raise ConfigError(path, "only 'exactly' requests are simulated (not firstAvailable)")
        mode = exact.get("allocationMode", "ExactCount")
        requests.append(
            Request(
                name=entry["name"],
                device_class=exact["deviceClassName"],
                selectors=_selectors(exact.get("selectors") or [], path),
                count=None if mode == "All" else int(exact.get("count", 1)),
            )
        )
    constraints = tuple(
        Constraint(entry["matchAttribute"], tuple(entry.get("requests") or ()))
        for entry in devices.get("constraints") or []
        if entry.get("matchAttribute")
    )
    name = (document.get("metadata") or {}).get("name", "")
    return Claim(name=name, requests=tuple(requests), constraints=constraints)


def select(selectors: Sequence[Selector], device: JsonObject) -> bool:
    """Every selector accepts the device; SelectorError when one fails on it."""
    return all(selector.matches(device) for selector in selectors)


def allocate(
    claim: Claim,
    classes: Mapping[str, Sequence[Selector]],
    devices: Mapping[str, JsonObject],
) -> Allocation:
    """The devices (name -> `cel_device`) the claim would be given, in the mapping's order."""
    candidates: dict[str, list[str]] = {}
    for request in claim.requests:
        if request.device_class not in classes:
            return Allocation(
                failure=f"request {request.name}: no DeviceClass {request.device_class}"
            )
        selectors = [*classes[request.device_class], *request.selectors]
        try:
            candidates[request.name] = [n for n, d in devices.items() if select(selectors, d)]
        except SelectorError as err:
            return Allocation(failure=f"request {request.name}: {err}")
    applies = [
        (c, [r.name for r in claim.requests if not c.requests or r.name in c.requests])
        for c in claim.constraints
    ]
    choices = []
    for constraint, names in applies:
        values = (_value(devices[d], constraint.attribute) for n in names for d in candidates[n])
        choices.append([v for v in dict.fromkeys(values) if v is not None])  # in slice order
    for tried, combination in enumerate(itertools.product(*choices)):
        if tried >= MAX_COMBINATIONS:
            return Allocation(failure="too many constraint values to try")
        chosen = _fill(claim, candidates, devices, applies, combination)
        if chosen is not None:
            settled = {c.attribute: v for (c, _), v in zip(applies, combination, strict=True)}
            return Allocation(devices=chosen, values=settled)
    return Allocation(failure=_why_not(claim, candidates, applies))


def _fill(
    claim: Claim,
    candidates: Mapping[str, list[str]],
    devices: Mapping[str, JsonObject],
    applies: Sequence[tuple[Constraint, list[str]]],
    combination: Sequence[object],
) -> dict[str, tuple[str, ...]] | None:
    used: set[str] = set()
    chosen: dict[str, tuple[str, ...]] = {}
    for request in claim.requests:
        rules = [
            (c.attribute, value)
            for (c, names), value in zip(applies, combination, strict=True)
            if request.name in names
        ]
        fits = [
            d
            for d in candidates[request.name]
            if d not in used and all(_value(devices[d], a) == v for a, v in rules)
        ]
        if request.count is None:
            if len(fits) != len(candidates[request.name]) or not fits:
                return None
            picked = fits
        elif len(fits) < request.count:
            return None
        else:
            picked = fits[: request.count]
        used.update(picked)
        chosen[request.name] = tuple(picked)
    return chosen


def _why_not(
    claim: Claim,
    candidates: Mapping[str, list[str]],
    applies: Sequence[tuple[Constraint, list[str]]],
) -> str:
    counts = ", ".join(
        f"{r.name}: {len(candidates[r.name])} matching, "
        + ("all" if r.count is None else f"{r.count}")
        + " wanted"
        for r in claim.requests
    )
    if applies:
        attributes = ", ".join(c.attribute for c, _ in applies)
        return (
            f"no devices satisfy the requests together under matchAttribute {attributes} ({counts})"
        )
    return f"not enough devices ({counts})"


def _value(device: JsonObject, attribute: str) -> object:
    domain, identifier = qualified(device["driver"], attribute)
    value: object = device["attributes"].get(domain, {}).get(identifier)
    return value


def _selectors(entries: Sequence[Any], where: str) -> tuple[Selector, ...]:
    selectors = []
    for position, entry in enumerate(entries):
        expression = (entry.get("cel") or {}).get("expression") if isinstance(entry, dict) else None
        if not isinstance(expression, str):
            raise ConfigError(f"{where}.selectors[{position}]", "needs cel.expression")
        try:
            selectors.append(Selector(expression))
        except SelectorError as err:
            raise ConfigError(f"{where}.selectors[{position}]", str(err)) from err
    return tuple(selectors)
