"""Which gated ResourceSlice fields an API server keeps, and what the node publishes given that.

An API server whose feature gate is off drops the gated fields of a slice it stores, and the
write succeeds. `ServerFeatures` is what a server keeps (`dra/serverfeatures.py` finds out by
asking it; `BY_DEFAULT` is each release's default, for `dra explain --kubernetes-version`), and
`slice_contents` the one place that turns it into devices and counter sets, for `dra serve` and
`dra explain` alike: nothing the scheduler of such a server could overbook or hand out unhealthy.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from deviceplugin.model.devices import Inventory
from deviceplugin.model.migpartitions import counter_sets
from deviceplugin.model.record import record
from deviceplugin.model.slices import TaintEffect, build_devices, quantity

if TYPE_CHECKING:
    from collections.abc import Mapping

    from deviceplugin.model.owners import Holdings

JsonObject = dict[str, Any]

FIRST_ON = "1.36"  # the first Kubernetes release with each of these gates on by default
PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
DEVICE_TAINTS = "DRADeviceTaints"


@record(frozen=True)
class ServerFeatures:
    """Which gated fields the API server keeps; `version` "" until a probe answered, `error`
    why the latest probe could not be made."""

    counters: bool
    consumable_capacity: bool
    taints: bool
    version: str = ""
    error: str | None = None

    @property
    def known(self) -> bool:
        return self.version != ""

    def document(self) -> JsonObject:
        """For /status."""
        return {**asdict(self), "known": self.known, "version": self.version or None}


UNKNOWN = ServerFeatures(counters=False, consumable_capacity=False, taints=False)
ALL_KEPT = ServerFeatures(counters=True, consumable_capacity=True, taints=True)

# What each Kubernetes release keeps with its default feature gates (the three gates are alpha,
# off, in 1.34 and 1.35 and on from 1.36), as the probe finds on a cluster of that release; for
# `dra explain --kubernetes-version`, which has no server to ask.
BY_DEFAULT = {
    "1.34": replace(UNKNOWN, version="v1.34"),
    "1.35": replace(UNKNOWN, version="v1.35"),
    "1.36": replace(ALL_KEPT, version="v1.36"),
    "1.37": replace(ALL_KEPT, version="v1.37"),
}


def slice_contents(
    inventory: Inventory,
    unhealthy: Mapping[str, str],
    driver: str,
    taint: TaintEffect | None,
    memory_shares: bool,
    dynamic_mig: bool,
    kept: ServerFeatures,
    blocked: Mapping[str, str] | None = None,
    withheld: Holdings | None = None,
) -> tuple[list[JsonObject], list[JsonObject]]:
    """The devices and counter sets to publish where the API server keeps `kept`: without
    counters no partition or counter set, without consumable capacity no share, without taints
    no unhealthy device (it would be offered untainted)."""
    shares = memory_shares and kept.consumable_capacity
    devices = build_devices(
        inventory, unhealthy, driver, taint, shares, dynamic_mig, blocked, withheld, kept.counters
    )
    if not kept.taints:
        devices = [d for d in devices if not d.get("taints")]
    with_counters = dynamic_mig and kept.counters
    return devices, counter_sets(inventory, quantity) if with_counters else []
