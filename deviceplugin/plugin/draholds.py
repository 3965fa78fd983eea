"""What prepared DRA claims and other device plugins hold on this node, so `serve` never offers
a GPU someone else handed to a pod that still runs.

A node that moves from a DRA driver (ours or NVIDIA's) back to the device plugin keeps its
prepared claims and their pods running. The kubelet reports them in PodResources `List`
(`dynamic_resources`, gate KubeletPodResourcesDynamicResources); `model.owners` maps them to the
inventory. Every advertised ID whose hardware a claim holds is Unhealthy, the claim and pod its
reason, until the kubelet no longer reports the claim: a held GPU withholds every ID on it, a
held MIG device its own IDs and its parent's whole-GPU IDs. The hold is laid over NVML health,
never written into it, so a release cannot make an Xid-unhealthy device healthy, nor a health
recovery a held one.

The same List reports the IDs device plugins handed out. One that this plugin does not advertise
(NVIDIA's plugin served the node before, or another ID strategy) is held just as a claim's
device is, until its pod ends: the kubelet would otherwise give the GPU behind it to a second
pod under one of our IDs. A replica ID (`<uuid>::<n>`) of a device this plugin shares by
replicas itself is not: its GPU is time-shared either way, as after a change of the replica
count.

Fail safe: no socket means no claims (a node without DRA); a socket that does not answer keeps
the last known holdings, logged once per change, since releasing on an error could give one GPU
two owners. The PodResources client and the mapping load only once the socket exists, so `serve`
on a node without it loads nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deviceplugin.model.devices import Health, Inventory, strip_replica
from deviceplugin.model.errors import PodResourcesError
from deviceplugin.model.log import log_event
from deviceplugin.model.resources import ResourceSet

if TYPE_CHECKING:
    from deviceplugin.model.assignments import ClaimDevice, PodDevice
    from deviceplugin.model.owners import Held, Holdings

# What the kubelet reported: the claims' devices and the device-plugin IDs, per container.
Reported = tuple[tuple["ClaimDevice", ...], tuple["PodDevice", ...]]

logger = logging.getLogger(__name__)

# The DRA drivers whose claims hold GPUs: this project's driver and NVIDIA's, by default.
DRA_DRIVERS = ("gpu.nvidia.com",)

# resource name -> device ID -> why a claim holds it
HeldIds = dict[str, dict[str, str]]


class DraHolds:
    """The claims the kubelet last reported on `socket`, and what they hold of the inventory."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._claims: tuple[ClaimDevice, ...] = ()
        self._plugin_ids: tuple[PodDevice, ...] = ()
        self._inventory: Inventory | None = None
        self._holdings: Holdings | None = None  # None: nothing held
        self._foreign: Holdings | None = None  # what other plugins' IDs held at the last reconcile
        self._error: str | None = None  # why the last List failed; None once it answers

    async def read(self) -> Reported | None:
        """What the kubelet reports now; None when it is what was adopted last, or unknown (the
        socket is there but List failed: the last known stay)."""
        reported: Reported = ((), ())
        if self.socket.exists():
            from deviceplugin.node.podresources import list_pod_resources

            try:
                found = await list_pod_resources(self.socket)
            except PodResourcesError as exc:
                self._failed(str(exc))
                return None
            if found is not None:
                reported = (found.claims, tuple(found.devices))
        if self._error is not None:
            log_event(logger, "plugin.dra-holds.known", socket=str(self.socket))
            self._error = None
        return None if reported == (self._claims, self._plugin_ids) else reported

    def adopt(self, reported: Reported, inventory: Inventory | None) -> bool:
        """`reported` is what the kubelet reports now: map it to `inventory`. True when what
        may be held changed (claims logged here, other plugins' IDs by `held_ids`)."""
        changed = reported[1] != self._plugin_ids
        self._claims, self._plugin_ids = reported
        return self.remap(inventory) or changed

    def remap(self, inventory: Inventory | None) -> bool:
        """Map the claims reported last to `inventory` (a new one after a MIG re-cut or a
        reload). True when what is held changed (logged)."""
        self._inventory = inventory
        holdings = None
        if self._claims and inventory is not None:
            from deviceplugin.model.owners import held_by_claims

            holdings = held_by_claims(inventory, self._claims, DRA_DRIVERS) or None
        if holdings == self._holdings:
            return False
        self._holdings = holdings
        log_event(logger, "plugin.dra-holds.changed", held=self._described())
        return True

    def held_ids(self, resources: Mapping[str, ResourceSet]) -> HeldIds:
        """Every ID of `resources` whose hardware a claim, or another plugin's ID, holds, with
        why, by resource."""
        foreign = self._foreign_holdings(resources)
        if foreign != self._foreign:
            described = [held.describe() for held in foreign.held] if foreign else []
            log_event(logger, "plugin.plugin-holds.changed", held=described)
            self._foreign = foreign
        held: HeldIds = {}
        for via, holdings in ((DRA, self._holdings), (OTHER_PLUGIN, foreign)):
            if holdings is None:
                continue
            for name, resource in resources.items():
                for device in resource.devices:
                    blocking = holdings.blocking(
                        device.gpu_uuid, device.mig.uuid if device.mig else None
                    )
                    if blocking and device.id not in held.get(name, {}):
                        held.setdefault(name, {})[device.id] = hold_reason(blocking, via)
        return held

    def _foreign_holdings(self, resources: Mapping[str, ResourceSet]) -> Holdings | None:
        """What IDs this plugin does not advertise hold: another device plugin's pods."""
        if not self._plugin_ids or self._inventory is None:
            return None
        ours = {(name, d.id) for name, r in resources.items() for d in r.devices}
        shared = {d.physical_uuid for r in resources.values() for d in r.devices if d.replica}
        foreign = [
            entry
            for entry in self._plugin_ids
            if (entry.resource, entry.device_id) not in ours
            and not ("::" in entry.device_id and strip_replica(entry.device_id) in shared)
        ]
        if not foreign:
            return None
        from deviceplugin.model.owners import held_by_device_plugins

        return held_by_device_plugins(self._inventory, foreign) or None

    def document(self, held: HeldIds) -> dict[str, Any]:
        """The `dra_holds` part of /status: where the claims are read, whether the last read
        answered, what they hold and which advertised IDs (`held`) that withholds."""
        return {
            "socket": str(self.socket),
            "drivers": list(DRA_DRIVERS),
            "known": self._error is None,
            "error": self._error,
            "held": self._described(),
            "held_by_other_plugins": (
                [held.describe() for held in self._foreign.held] if self._foreign else []
            ),
            "devices": {name: sorted(ids) for name, ids in held.items()},
        }

    def _failed(self, error: str) -> None:
        if error != self._error:
            log_event(
                logger,
                "plugin.dra-holds.unknown",
                logging.WARNING,
                socket=str(self.socket),
                error=error,
                kept=self._described(),
                hint="what claims held at the last answer stays withheld until the kubelet "
                "answers again",
            )
        self._error = error

    def _described(self) -> list[dict[str, str]]:
        return [held.describe() for held in self._holdings.held] if self._holdings else []


DRA = "through DRA"
OTHER_PLUGIN = "from another device plugin"


def hold_reason(blocking: tuple[Held, ...], via: str = DRA) -> str:
    """Why a device is Unhealthy while others hold it: each claim's device, or other plugin's
    ID, with its pod."""
    return "; ".join(f"held by {held.source} (pod {held.holder}) {via}" for held in blocking)


def withhold(resources: Mapping[str, ResourceSet], held: HeldIds) -> dict[str, ResourceSet]:
    """`resources` with every `held` ID Unhealthy for its hold; an ID Unhealthy already keeps
    its own reason."""
    result = dict(resources)
    for name, ids in held.items():
        resource = result.get(name)
        if resource is None:
            continue
        devices = tuple(
            replace(device, health=Health.UNHEALTHY, reason=ids[device.id])
            if device.healthy and device.id in ids
            else device
            for device in resource.devices
        )
        result[name] = replace(resource, devices=devices)
    return result
