"""Which gated ResourceSlice fields the API server keeps, found by asking it.

An API server whose feature gate is off drops the gated fields of a slice it stores, and the
write succeeds: discovery cannot tell, only what comes back can. So the probe makes two
server-side dry-run creates (`?dryRun=All`: answered as stored, nothing stored, nobody
notified) of this node's pool, which the node-restriction policy lets the driver write:

- a slice of one device with a taint (DRADeviceTaints), `allowMultipleAllocations` and a
  capacity `requestPolicy` (DRAConsumableCapacity), and `consumesCounters` of
- a slice of its own holding that counter set (DRAPartitionableDevices; the layout from 1.35).

A 422 for the device (a 1.34 server with the gate on wants counters in the devices' own slice,
a layout this driver does not write) counts as counters not kept, and the device is asked again
without them. `version` is the server's gitVersion, asked first: the driver probes again when
it changes (an API server upgrade).

The probe is bounded by the client's deadlines and never raises. Until it has answered, every
field counts as not kept (`UNKNOWN`), which is the safe side: no partition or share the
scheduler could overbook, and an unhealthy device left out of the slice instead of tainted.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from typing import Any, Protocol

from deviceplugin.model.gatedfields import (
    CONSUMABLE_CAPACITY,
    FIRST_ON,
    PARTITIONABLE_DEVICES,
    UNKNOWN,
    ServerFeatures,
)
from deviceplugin.model.log import log_event
from deviceplugin.model.memoryshares import MEMORY, request_policy
from deviceplugin.model.slices import quantity
from deviceplugin.runtime.kubeclient import KubeError

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

_PROBE = "probe"  # the device's and counter set's name
_GIB = 1 << 30
# The probe device's memory: room above the smallest share for a step, which the API server
# checks (a device of 1 GiB, the smallest share itself, is refused as invalid).
_PROBE_MEMORY = 16 * _GIB
_COUNTERS = {"memory": {"value": "1Gi"}}


class ProbeApi(Protocol):
    """The calls the probe makes (`kubeapi.KubeApi`; raise `KubeError`)."""

    async def server_version(self) -> str: ...
    async def dry_run_slice(self, body: JsonObject) -> JsonObject: ...


def missing(
    features: ServerFeatures, dynamic_mig: bool, memory_shares: bool
) -> tuple[tuple[str, str], ...]:
    """(gate, why) for each thing the flags ask that the driver does not publish, as the
    server does not keep (or is not yet known to keep) its fields: each a reason it is not
    ready. (Taints not kept cost nothing asked for: an unhealthy device is left out.)"""
    asked = [
        (dynamic_mig, features.counters, "counters", PARTITIONABLE_DEVICES, "--mig-mode dynamic",
         "no MIG partition, only whole GPUs"),
        (memory_shares, features.consumable_capacity, "consumable capacity", CONSUMABLE_CAPACITY,
         "--gpu-sharing memory", "whole GPUs without memory shares"),
    ]  # fmt: skip
    reasons: list[tuple[str, str]] = []
    for wanted, kept, what, gate, flag, instead in asked:
        if not wanted or kept:
            continue
        if features.known:
            why = (
                f"the API server ({features.version}) drops ResourceSlice {what}: its feature "
                f"gate {gate} is off (on by default from Kubernetes {FIRST_ON}); {flag} "
                f"publishes {instead}"
            )
        else:
            error = f": {features.error}" if features.error else ""
            why = (
                f"not yet known whether the API server keeps ResourceSlice {what} ({gate})"
                f"{error}; {flag} publishes {instead} until it is"
            )
        reasons.append((gate, why))
    return tuple(reasons)


class ServerProbe:
    """Probes the API server for this node's pool of `driver`; `features` holds the latest
    answer (UNKNOWN before the first, kept when a later probe cannot be made)."""

    def __init__(self, api: ProbeApi, node: str, driver: str) -> None:
        self.features = UNKNOWN
        self._api = api
        self._node = node
        self._driver = driver

    async def probe(self) -> ServerFeatures:
        """Ask the server now; never raises."""
        try:
            version = await self._api.server_version()
            sets = await self._api.dry_run_slice(self._slice(counters=True))
            counters = bool(sets.get("spec", {}).get("sharedCounters"))
            try:
                answer = await self._api.dry_run_slice(self._slice(self._device(True)))
            except KubeError as err:
                if err.status != 422:
                    raise
                # counters of another slice refused (1.34): asked again without, so not kept
                answer = await self._api.dry_run_slice(self._slice(self._device(False)))
            kept = _first_device(answer)
            found = ServerFeatures(
                counters=counters and bool(kept.get("consumesCounters")),
                consumable_capacity=bool(kept.get("allowMultipleAllocations"))
                and bool(((kept.get("capacity") or {}).get(MEMORY) or {}).get("requestPolicy")),
                taints=bool(kept.get("taints")),
                version=version or "unknown",
            )
        except KubeError as err:
            if str(err) != self.features.error:
                log_event(
                    logger,
                    "dra.server.probe.failed",
                    logging.WARNING,
                    error=str(err),
                    hint="gated fields count as not kept until a probe answers",
                )
            self.features = replace(self.features, error=str(err))
            return self.features
        if found != self.features:
            log_event(logger, "dra.server.probed", **asdict(found))
        self.features = found
        return found

    async def version_changed(self) -> bool:
        """Whether the server's version differs from the one probed (one cheap GET); a probe
        that never answered counts as changed. False when the server does not answer."""
        if not self.features.known:
            return True
        try:
            return await self._api.server_version() != self.features.version
        except KubeError:
            return False

    def _slice(self, device: JsonObject | None = None, counters: bool = False) -> JsonObject:
        """A slice of this node's pool (the only one the node-restriction policy lets the
        driver write) holding `device`, or the probe's counter set."""
        spec: JsonObject = {
            "driver": self._driver,
            "nodeName": self._node,
            "pool": {"name": self._node, "generation": 0, "resourceSliceCount": 1},
        }
        if device is not None:
            spec["devices"] = [device]
        if counters:
            spec["sharedCounters"] = [{"name": _PROBE, "counters": _COUNTERS}]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": f"{self._node}-{self._driver}-probe-"},
            "spec": spec,
        }

    def _device(self, with_counters: bool) -> JsonObject:
        """A device with every gated field, consuming the probe's counter set if asked."""
        device: JsonObject = {
            "name": _PROBE,
            "allowMultipleAllocations": True,
            "capacity": {
                MEMORY: {
                    "value": quantity(_PROBE_MEMORY),
                    "requestPolicy": request_policy(_PROBE_MEMORY, quantity),
                }
            },
            "taints": [{"key": f"{self._driver}/{_PROBE}", "effect": "NoSchedule"}],
        }
        if with_counters:
            device["consumesCounters"] = [{"counterSet": _PROBE, "counters": _COUNTERS}]
        return device


def _first_device(answer: JsonObject) -> JsonObject:
    devices = (answer.get("spec") or {}).get("devices") or [{}]
    return devices[0] if isinstance(devices[0], dict) else {}
