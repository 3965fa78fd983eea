"""What prepared DRA claims hold on this node, so `serve` never offers a GPU a claim still holds.

A node that moves from a DRA driver (ours or NVIDIA's) back to the device plugin keeps its
prepared claims and their pods running. The kubelet reports them in PodResources `List`
(`dynamic_resources`, gate KubeletPodResourcesDynamicResources); `model.owners` maps them to the
inventory. Every advertised ID whose hardware a claim holds is Unhealthy, the claim and pod its
reason, until the kubelet no longer reports the claim: a held GPU withholds every ID on it, a
held MIG device its own IDs and its parent's whole-GPU IDs. The hold is laid over NVML health,
never written into it, so a release cannot make an Xid-unhealthy device healthy, nor a health
recovery a held one.

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

from deviceplugin.model.devices import Health, Inventory
from deviceplugin.model.errors import PodResourcesError
from deviceplugin.model.log import log_event
from deviceplugin.model.resources import ResourceSet

if TYPE_CHECKING:
    from deviceplugin.model.assignments import ClaimDevice
    from deviceplugin.model.owners import Held, Holdings

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
        self._holdings: Holdings | None = None  # None: nothing held
        self._error: str | None = None  # why the last List failed; None once it answers

    async def read(self) -> tuple[ClaimDevice, ...] | None:
        """The claims' devices the kubelet reports now; None when they are those adopted last,
        or unknown (the socket is there but List failed: the last known stay)."""
        claims: tuple[ClaimDevice, ...] = ()
        if self.socket.exists():
            from deviceplugin.kubelet.pods import list_pod_resources

            try:
                found = await list_pod_resources(self.socket)
            except PodResourcesError as exc:
                self._failed(str(exc))
                return None
            claims = () if found is None else found.claims
        if self._error is not None:
            log_event(logger, "plugin.dra-holds.known", socket=str(self.socket))
            self._error = None
        return None if claims == self._claims else claims

    def adopt(self, claims: tuple[ClaimDevice, ...], inventory: Inventory | None) -> bool:
        """`claims` are what the kubelet reports now: map them to `inventory`. True when what
        is held changed (logged)."""
        self._claims = claims
        return self.remap(inventory)

    def remap(self, inventory: Inventory | None) -> bool:
        """Map the claims reported last to `inventory` (a new one after a MIG re-cut or a
        reload). True when what is held changed (logged)."""
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
        """Every ID of `resources` whose hardware a claim holds, with why, by resource."""
        holdings = self._holdings
        if holdings is None:
            return {}
        held: HeldIds = {}
        for name, resource in resources.items():
            for device in resource.devices:
                blocking = holdings.blocking(
                    device.gpu_uuid, device.mig.uuid if device.mig else None
                )
                if blocking:
                    held.setdefault(name, {})[device.id] = hold_reason(blocking)
        return held

    def document(self, held: HeldIds) -> dict[str, Any]:
        """The `dra_holds` part of /status: where the claims are read, whether the last read
        answered, what they hold and which advertised IDs (`held`) that withholds."""
        return {
            "socket": str(self.socket),
            "drivers": list(DRA_DRIVERS),
            "known": self._error is None,
            "error": self._error,
            "held": self._described(),
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


def hold_reason(blocking: tuple[Held, ...]) -> str:
    """Why a device is Unhealthy while claims hold it: each claim with its device and pod."""
    return "; ".join(f"held by {held.source} (pod {held.holder}) through DRA" for held in blocking)


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
