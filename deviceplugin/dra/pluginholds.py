"""What device plugins handed out on this node, so that the DRA driver never publishes it.

A node moves from a device plugin (ours or NVIDIA's) to DRA with its pods running: the plugin
leaves, the kubelet keeps reporting the devices it handed out for as long as their pods live,
and the scheduler does not count those pods against DRA devices. So the driver reads the
kubelet's PodResources `List` and withholds every device such a pod holds (`model/owners.py`
says which), until the kubelet reports the pod gone.

Withheld, not tainted: a claim author can tolerate a taint and so take a GPU a running pod
holds, and an API server without the DRADeviceTaints gate (off before 1.36) drops taints
silently. A device left out of the slice cannot be allocated on any version.

Fail safe: once a device plugin has been seen on the node (a live socket while this driver
ran, or the kubelet's device-manager checkpoint naming an NVIDIA resource a pod holds), a
PodResources socket that is missing or does not answer means the holdings are unknown. Then
nothing new is published as free: the last holdings read stay, and before the first read every
GPU is withheld.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from deviceplugin.model.assignments import PodResources
from deviceplugin.model.devices import Inventory
from deviceplugin.model.errors import PodResourcesError
from deviceplugin.model.log import log_event
from deviceplugin.model.owners import NVIDIA_DOMAIN, Held, Holdings, held_by_device_plugins

logger = logging.getLogger(__name__)

KUBELET_CHECKPOINT = "kubelet_internal_checkpoint"  # the device manager's, in device-plugins/
POD_RESOURCES_SOCKET = Path("pod-resources") / "kubelet.sock"  # under the kubelet's root
UNKNOWN_HOLDER = "unknown"


class PluginHolds:
    """The devices device-plugin pods hold, as last read; `refresh()` reads them again."""

    def __init__(self, pod_resources: Path, device_plugins_dir: Path) -> None:
        self.socket = pod_resources
        self._checkpoint = device_plugins_dir / KUBELET_CHECKPOINT
        self.holdings = Holdings()
        self.unknown: str | None = None  # why the holdings could not be read; None when read
        self.plugin_seen = False
        self._read_once = False

    def saw_device_plugin(self) -> None:
        """A device plugin serves NVIDIA GPUs here now: once it leaves, its pods' devices must
        be read afresh before anything is published as free."""
        self.plugin_seen = True
        self._read_once = False

    @property
    def needs_reading(self) -> bool:
        """Whether the periodic check must read again: something is held, or not known."""
        return bool(self.holdings) or self.unknown is not None

    async def refresh(self, inventory: Inventory) -> bool:
        """Read PodResources and map what device-plugin pods hold (an ID that is also the name
        of a claimed DRA device, as for a claim of an extended resource, is not a plugin's).
        True when the holdings changed."""
        if not self.plugin_seen:
            self.plugin_seen = self._kubelet_remembers_plugin()
        try:
            found = await _list(self.socket)
        except PodResourcesError as err:
            return self._unknown(inventory, str(err))
        if found is None:
            if not self.plugin_seen:
                return self._known(Holdings())
            why = f"pod-resources socket {self.socket} not found"
            return self._unknown(inventory, why)
        claimed = {entry.device for entry in found.claims}
        devices = [entry for entry in found.devices if entry.device_id not in claimed]
        return self._known(held_by_device_plugins(inventory, devices))

    def _known(self, holdings: Holdings) -> bool:
        if self.unknown is not None:
            log_event(logger, "dra.held.known", socket=str(self.socket))
        self.unknown = None
        self._read_once = True
        return self._adopt(holdings)

    def _unknown(self, inventory: Inventory, why: str) -> bool:
        if not self.plugin_seen:  # no device plugin was ever here: nothing it could hold
            return self._known(Holdings())
        why = (
            f"{why}: which GPUs device-plugin pods hold is unknown, so nothing new is "
            "published as free (mount /var/lib/kubelet/pod-resources into the driver)"
        )
        if why != self.unknown:
            log_event(logger, "dra.held.unknown", logging.ERROR, error=why)
        self.unknown = why
        if self._read_once:
            return False  # the last holdings read stay
        every = Holdings(Held(gpu.uuid, None, UNKNOWN_HOLDER, why) for gpu in inventory.gpus)
        return self._adopt(every)

    def _adopt(self, holdings: Holdings) -> bool:
        if holdings == self.holdings:
            return False
        self.holdings = holdings
        for entry in holdings.held:
            if entry.unmapped:
                log_event(logger, "dra.held.unmapped", logging.WARNING, **entry.describe())
        log_event(
            logger,
            "dra.held.changed",
            held=[entry.describe() for entry in holdings.held],
            hint="withheld from the slices until the kubelet reports their pods gone",
        )
        return True

    def _kubelet_remembers_plugin(self) -> bool:
        """Whether the kubelet's device-manager checkpoint says a pod holds a device of an
        NVIDIA resource: a plugin served here before this driver started."""
        try:
            data = json.loads(self._checkpoint.read_text())
            entries = data["Data"]["PodDeviceEntries"] or []
            names = {str(entry.get("ResourceName", "")) for entry in entries}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return False
        return any(name.split("/", 1)[0] == NVIDIA_DOMAIN for name in names)


async def _list(socket: Path) -> PodResources | None:
    """PodResources' `List`, its client loaded only on a node that serves it: a driver that
    never met a device plugin starts without it."""
    if not socket.exists():
        return None
    from deviceplugin.node.podresources import list_pod_resources

    return await list_pod_resources(socket)
