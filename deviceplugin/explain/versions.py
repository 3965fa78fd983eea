"""`dra explain --kubernetes-version`: the answer of that release's API server and scheduler with
their default feature gates, which drop what they do not serve.

What the node publishes there is what `dra serve` publishes after probing such a server (no
partitions or counter sets without DRAPartitionableDevices, whole GPUs without
DRAConsumableCapacity, unhealthy devices left out without DRADeviceTaints). A claim loses the
gated fields the API server drops on create: `capacity.requests` and `distinctAttribute`
(DRAConsumableCapacity), `tolerations` (DRADeviceTaints). Each one dropped is a note on the
claim, so the report says why a claim is allocated differently than on the newest release.
"""

from __future__ import annotations

from dataclasses import replace

from deviceplugin.explain.resourceapi import Claim, DeviceChoice, Request
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.gatedfields import (
    ALL_KEPT,
    BY_DEFAULT,
    CONSUMABLE_CAPACITY,
    DEVICE_TAINTS,
    ServerFeatures,
)


def features(version: str | None) -> ServerFeatures:
    """What a server of `version` (`1.35`, `v1.35`; None: the newest) keeps by default;
    ConfigError naming the versions known otherwise."""
    if version is None:
        return ALL_KEPT
    minor = version.removeprefix("v")
    if minor not in BY_DEFAULT:
        known = ", ".join(BY_DEFAULT)
        raise ConfigError("--kubernetes-version", f"{version!r} is not one of {known}")
    return BY_DEFAULT[minor]


def as_stored(claim: Claim, kept: ServerFeatures, release: str) -> Claim:
    """`claim` as a server that keeps `kept` stores it, with a note per dropped field."""
    notes: list[str] = []

    def dropped(where: str, field: str, gate: str) -> None:
        notes.append(f"{where}: {field} dropped by a Kubernetes {release} API server ({gate} off)")

    def choice(one: DeviceChoice) -> DeviceChoice:
        if one.capacity and not kept.consumable_capacity:
            dropped(f"request {one.name}", "capacity.requests", CONSUMABLE_CAPACITY)
            one = replace(one, capacity={})
        if one.tolerations and not kept.taints:
            dropped(f"request {one.name}", "tolerations", DEVICE_TAINTS)
            one = replace(one, tolerations=())
        return one

    def request(one: Request) -> Request:
        return replace(one, choices=tuple(choice(c) for c in one.choices))

    constraints = claim.constraints
    if not kept.consumable_capacity:
        for constraint in constraints:
            if constraint.distinct:
                dropped(
                    "constraint", f"distinctAttribute {constraint.attribute}", CONSUMABLE_CAPACITY
                )
        constraints = tuple(c for c in constraints if not c.distinct)
    requests = tuple(request(r) for r in claim.requests)
    return replace(claim, requests=requests, constraints=constraints, notes=(*claim.notes, *notes))
